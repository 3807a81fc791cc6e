"""fgd's choices on small clusters, next to what packing would do, and the API's edges."""

import pytest

from console.scheduler.cluster import Cluster
from console.scheduler.mig import STANDARD_PROFILES
from console.scheduler.model import MIG, SHARED, WHOLE, Gpu, MigProfile, Node, Placement, Request
from console.scheduler.policies import apply, place, release
from console.scheduler.workload import REFRESH_MIN, Workload

PROFILES = {p.name: p for p in STANDARD_PROFILES}


def shared_host(name: str, used: list[int], cpu: int = 64000, ram: int = 262144) -> Node:
    gpus = [Gpu(i, "a100", SHARED, 40960, used_milli=u) for i, u in enumerate(used)]
    return Node(name, "eu", True, cpu, ram, gpus)


def cluster(hosts: list[Node], *expected: Request) -> Cluster:
    """A cluster whose workload is `expected` (fixed), or the default prior."""
    return Cluster(hosts, Workload(expected, learn=False) if expected else None)


def test_fgd_fills_a_partly_used_gpu_before_splitting_an_unused_one():
    hosts = [shared_host("unused", [0]), shared_host("half", [500])]
    quarter = Request(SHARED, milli=250)
    assert place(quarter, cluster(hosts)).host_id == "half"
    assert place(quarter, cluster(hosts), "first-fit").host_id == "unused"


def test_fgd_keeps_room_for_the_shapes_it_expects():
    """With 600s expected, a 300 on the GPU with 700 free would leave 400 that no 600 fits;
    best-fit takes it (tightest), fgd breaks the unused GPU, which still fits a 600 after."""
    hosts = [shared_host("seven", [300]), shared_host("unused", [0])]
    expected = Request(SHARED, milli=600)
    request = Request(SHARED, milli=300)
    assert place(request, cluster(hosts, expected), "best-fit").host_id == "seven"
    assert place(request, cluster(hosts, expected)).host_id == "unused"


def test_fgd_keeps_whole_gpu_sets_for_multi_gpu_shapes():
    def host(name: str, count: int) -> Node:
        return Node(
            name, "eu", True, 10**6, 10**7, [Gpu(i, "h100", WHOLE, 81920) for i in range(count)]
        )

    hosts = [host("eight", 8), host("nine", 9)]
    expected = (Request(WHOLE, gpu_count=8), Request(WHOLE, gpu_count=1))
    one = Request(WHOLE, gpu_count=1)
    assert place(one, cluster(hosts, *expected), "best-fit").host_id == "eight"
    assert place(one, cluster(hosts, *expected)).host_id == "nine"  # eight stays a set of 8


def test_fgd_puts_a_mig_slice_on_a_started_gpu_before_an_empty_one():
    empty = Gpu(0, "a100", MIG, 81920)
    started = Gpu(1, "a100", MIG, 81920, mig_used=PROFILES["3g.40gb"].mask(0))
    hosts = [Node("h", "eu", True, 64000, 262144, [empty, started])]
    slice_1g = Request(MIG, mig_profile=PROFILES["1g.10gb"])
    assert place(slice_1g, cluster(hosts)).gpu_indexes == (1,)  # the empty GPU keeps its 7g
    first = place(slice_1g, cluster(hosts), "first-fit")
    assert (first.gpu_indexes, first.mig_start) == ((0,), 0)


def test_fgd_chooses_the_mig_start_that_keeps_the_expected_profiles():
    hosts = [Node("h", "eu", True, 64000, 262144, [Gpu(0, "a100", MIG, 81920)])]
    expected = [Request(MIG, mig_profile=PROFILES[name]) for name in ("1g.10gb", "4g.40gb")]
    slice_1g = Request(MIG, mig_profile=PROFILES["1g.10gb"])
    assert place(slice_1g, cluster(hosts, *expected)).mig_start == 4  # 4g keeps start 0
    assert place(slice_1g, cluster(hosts, *expected), "best-fit").mig_start == 0


def test_fgd_keeps_vcpu_heavy_requests_off_hosts_they_would_strand():
    hosts = [shared_host("lean", [0], cpu=20000), shared_host("rich", [0], cpu=100000)]
    expected = Request(SHARED, milli=1000, cpu_milli=16000)
    heavy = Request(SHARED, milli=500, cpu_milli=16000)
    assert place(heavy, cluster(hosts, expected), "best-fit").host_id == "lean"
    # on "lean", 4000 vCPU milli would feed only 250 of the 500 milli-GPU left
    assert place(heavy, cluster(hosts, expected)).host_id == "rich"


def test_fgd_feeds_gpus_stranded_for_vcpu_with_a_light_request():
    """`starved` has 1800 milli-GPU free but vCPU for about 225: a vCPU-free request there
    uses what would go unused, even though its GPU-level fit is worse than on `exact`."""
    hosts = [shared_host("exact", [700]), shared_host("starved", [200, 0], cpu=4000)]
    expected = [Request(SHARED, milli=m, cpu_milli=8000) for m in (500, 400)]
    light = Request(SHARED, milli=300)
    assert place(light, cluster(hosts, *expected), "best-fit").host_id == "exact"
    assert place(light, cluster(hosts, *expected)).host_id == "starved"


def test_fgd_keeps_vcpu_rich_hosts_for_the_vcpu_heavy_half_of_the_workload():
    """Half the workload brings 2 vCPU milli per milli-GPU, half 30 (11.3 on average).
    "lean" feeds its two GPUs at the average but less than one at the heavy half's ratio: a
    light request there uses GPU capacity the heavy half could not, and "rich" keeps its GPU
    and vCPU for a heavy one. With light requests alone expected nothing is stranded
    anywhere, and the tighter host wins, as with best-fit."""
    hosts = [shared_host("rich", [0]), shared_host("lean", [0, 0], cpu=24000)]
    light = Request(SHARED, milli=500, cpu_milli=1000)
    heavy = Request(SHARED, milli=250, cpu_milli=7500)
    assert place(light, cluster(hosts, light, heavy), "best-fit").host_id == "rich"
    assert place(light, cluster(hosts, light, heavy)).host_id == "lean"
    assert place(light, cluster(hosts, light)).host_id == "rich"


def test_the_workload_cuts_its_shapes_into_ratio_classes_of_equal_share():
    """Lightest first, each at its shapes' combined vCPU and RAM per milli-GPU; a shape
    falls in the class where the middle of its share falls."""
    heavy = [Request(SHARED, milli=100, cpu_milli=8000, ram_mib=8192)] * 3
    light = [Request(SHARED, milli=500, cpu_milli=2000, ram_mib=4096)] * 2
    middle = [Request(SHARED, milli=250, cpu_milli=2000, ram_mib=4096)]
    ratios = Workload(heavy + light + middle, learn=False).snapshot().ratios
    # light (2/6, 4 and ~8.2 per milli) and middle (1/6, 8 and ~16.4): middle's share
    # spans 2/6..3/6, its middle below one half
    assert ratios == ((0.5, 6000 / 1250, 12288 / 1250), (0.5, 80.0, 81.92))
    assert Workload([], learn=False).snapshot().ratios == ()


def test_a_vcpu_only_request_goes_where_no_gpu_needs_the_vcpu():
    hosts = [shared_host("gpus", [0, 0], cpu=16000), shared_host("full", [1000], cpu=16000)]
    request = Request(SHARED, gpu_count=0, cpu_milli=8000)
    placement = place(request, cluster(hosts, Request(SHARED, milli=500, cpu_milli=8000)))
    assert (placement.host_id, placement.gpu_indexes) == ("full", ())


def test_the_workload_learns_from_arrivals_over_its_prior():
    workload = Workload()
    prior = workload.snapshot()
    assert {shape.mode for shape, _ in prior.shapes[MIG]} == {MIG}
    for _ in range(REFRESH_MIN):
        workload.observe(Request(SHARED, milli=300, cpu_milli=4000, ram_mib=1024))
    learned = workload.snapshot()
    assert learned.version == prior.version + 1
    (p300,) = [p for shape, p in learned.shapes[SHARED] if shape.milli == 300]
    assert p300 > 0.5
    assert all(cpu > 0 and ram > 0 for _, cpu, ram in learned.ratios[-1:])
    fixed = Workload([Request(SHARED, milli=300)], learn=False)
    fixed.observe(Request(SHARED, milli=700))
    assert [s.milli for s, _ in fixed.snapshot().shapes[SHARED]] == [300]


@pytest.mark.parametrize(
    "fields",
    [
        {"mode": "fractional"},
        {"mode": SHARED, "milli": 0},
        {"mode": SHARED, "milli": 1500},
        {"mode": SHARED, "gpu_count": 2, "milli": 500},
        {"mode": MIG},
        {"mode": MIG, "mig_profile": PROFILES["1g.10gb"], "gpu_count": 2},
        {"mode": WHOLE, "mig_profile": PROFILES["1g.10gb"]},
        {"mode": WHOLE, "cpu_milli": -1},
    ],
)
def test_requests_that_make_no_sense_are_refused(fields):
    with pytest.raises(ValueError):
        Request(**fields)


def test_mig_profiles_must_fit_the_eight_slices():
    with pytest.raises(ValueError):
        MigProfile("bad", 4, (0, 6))


def test_apply_and_release_refuse_what_does_not_fit_or_is_not_held():
    hosts = [shared_host("h", [900, 100])]
    request = Request(SHARED, milli=200, models="a100")
    with pytest.raises(ValueError):
        apply(Placement(request, "h", (0,)), hosts)  # 900 + 200 > 1000
    with pytest.raises(ValueError):
        release(Placement(request, "h", (1,)), hosts)  # only 100 held
    with pytest.raises(ValueError):
        apply(Placement(Request(SHARED, milli=100), "h", (1, 1)), hosts)
    with pytest.raises(ValueError):
        apply(Placement(Request(WHOLE), "h", (1,)), hosts)  # a shared GPU
    assert hosts == [shared_host("h", [900, 100])]


def test_refresh_takes_in_changes_made_outside():
    hosts = [shared_host("a", [0]), shared_host("b", [0])]
    state = cluster(hosts)
    hosts[1].gpus[0].used_milli = 500
    state.refresh("b")
    assert place(Request(SHARED, milli=500), state).host_id == "b"
    hosts[1].gpus[0].healthy = False
    hosts[0].schedulable = False
    state.refresh("a")
    state.refresh("b")
    assert place(Request(SHARED, milli=100), state) is None


def test_plain_host_lists_work_without_a_cluster():
    hosts = [shared_host("h", [0])]
    placement = place(Request(SHARED, milli=400, gpu_memory_mib=1024, cpu_milli=1000), hosts)
    apply(placement, hosts)
    assert (hosts[0].gpus[0].used_milli, hosts[0].gpus[0].used_memory_mib) == (400, 1024)
    assert hosts[0].free_cpu_milli == 63000
    release(placement, hosts)
    assert hosts == [shared_host("h", [0])]
