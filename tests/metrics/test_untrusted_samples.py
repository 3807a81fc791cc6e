"""A host reports only what it has: samples of GPUs and MIG devices that are not in its inventory
are left out (no series, no history, nothing on /metrics), labels come from the console's
records, and one row the database refuses does not stop the history of everyone."""

import time
from datetime import UTC, datetime

import pytest

from agent.samples import make_sample
from console.fleet.models import Gpu
from console.metrics import history, ingest, live
from console.metrics.models import MetricMinute
from tests.metrics.conftest import gpu_sample
from tests.metrics.test_prometheus import families, scrape

pytestmark = pytest.mark.usefixtures("window_backend")

MIG = "MIG-host-a-0-0"


@pytest.fixture
def mig_gpu(world):
    """host-a's gpu0 holds one MIG device the console knows of (from the heartbeats)."""
    Gpu.objects.filter(host=world.host, index=0).update(
        mig_devices=[{"uuid": MIG, "profile": "3g.40gb", "start": 4, "size": 4}]
    )
    return world


def mig_sample(ts, mig_uuid, index=0, gpu_uuid="GPU-host-a-0", util=10.0):
    return make_sample(
        ts, "mig", index, gpu_uuid, mig_uuid=mig_uuid, gpu_util=util, mem_used_mib=10,
        mem_total_mib=40192,
    )  # fmt: skip


def test_a_flood_of_invented_mig_devices_leaves_nothing_behind(mig_gpu, settings):
    """Finding 5: 20,000 distinct MIG UUIDs in one batch took 25 s, left 20,000 junk history
    rows for 30 days and a 14.7 MB /metrics."""
    settings.METRICS_ALLOWED_IPS = ["127.0.0.1"]
    world = mig_gpu
    now = time.time()
    minute = live.minute_of(now)
    flood = [mig_sample(now, f"MIG-junk-{n}") for n in range(20_000)]
    started = time.perf_counter()
    result = ingest.ingest_samples(world.host, [*flood, mig_sample(now, MIG, util=42.0)])
    took = time.perf_counter() - started
    assert (result.unknown, result.points) == (20_000, 1)
    assert took < 5.0, f"{took:.1f} s for one batch"
    assert [s for s in live.store().latest() if s.startswith("mig:")] == [
        f"mig:{world.host.pk}:0:{MIG}"
    ]
    history.downsample(now=minute + 60 + history.GRACE_SECONDS)
    assert list(MetricMinute.objects.values_list("series", flat=True)) == [
        f"mig:{world.host.pk}:0:{MIG}"
    ]
    status, text = scrape()
    assert status == 200 and len(text) < 20_000
    [series] = families(text)["DCGM_FI_DEV_GPU_UTIL"]
    assert series.labels["GPU_I_PROFILE"] == "3g.40gb"


@pytest.mark.parametrize(
    ("index", "gpu_uuid"),
    [
        (7, "GPU-host-a-7"),  # host-a has gpu0 and gpu1 only
        (1, "GPU-host-a-0"),  # gpu0's UUID at index 1
        (0, "GPU-host-b-0"),  # another host's GPU
        (0, "GPU-invented"),
    ],
)
def test_samples_of_gpus_the_host_does_not_have_are_left_out(world, index, gpu_uuid):
    result = ingest.ingest_samples(
        world.host, [make_sample(time.time(), "gpu", index, gpu_uuid, gpu_util=5.0)]
    )
    assert (result.unknown, result.points) == (1, 0)
    assert live.store().latest() == {}


def test_labels_come_from_the_consoles_records(mig_gpu):
    world = mig_gpu
    now = time.time()
    # An unreadable GPU reports no UUID: it is still the console's gpu1, with its UUID.
    ingest.ingest_samples(
        world.host,
        [
            make_sample(now, "gpu", 1, None, gpu_util=1.0, healthy=False),
            mig_sample(now, MIG, gpu_uuid=None),
        ],
    )
    latest = live.store().latest()
    assert latest[f"gpu:{world.host.pk}:1"]["uuid"] == "GPU-host-a-1"
    assert latest[f"mig:{world.host.pk}:0:{MIG}"]["uuid"] == "GPU-host-a-0"


def test_an_allocation_on_a_mig_device_not_yet_in_the_inventory_is_still_its_instances(world):
    """A MIG device made for an allocation reaches the inventory with the next heartbeat: its
    allocation's samples are the instance's meanwhile, but invent no MIG series."""
    sample = {
        **mig_sample(time.time(), "MIG-new"),
        "kind": "allocation",
        "allocation": "alloc-train",
    }
    result = ingest.ingest_samples(world.host, [sample])
    assert (result.unknown, result.points) == (0, 1)
    latest = live.store().latest()
    assert latest[f"instance:{world.train.pk}"]["mig_uuid"] is None
    assert not [s for s in latest if s.startswith("mig:")]


def test_one_row_the_database_refuses_does_not_stop_the_history(world, caplog):
    """Finding 1: a row that broke a CHECK constraint made every downsampling run fail (until
    its minute left the live window) and so stopped the history of every tenant."""
    now = time.time()
    minute = live.minute_of(now) - 60
    ingest.ingest_samples(world.host, [gpu_sample(minute + 1, 0, util=30.0)])
    # What the door refuses now, as an older console let in: gpu_index -1.
    bad = live.Point(f"gpu:{world.host.pk}:-1", minute + 2, (1.0, 1, 2, 3.0, 4.0, 5))
    live.store().add([bad], {}, now)
    answer = history.downsample(now=minute + 60 + history.GRACE_SECONDS)
    assert answer["rows"] == 1
    row = MetricMinute.objects.get()
    assert (row.series, row.minute) == (
        f"gpu:{world.host.pk}:0",
        datetime.fromtimestamp(minute, UTC),
    )
    assert f"gpu:{world.host.pk}:-1" in caplog.text  # logged, for the operator
    # The next minute folds as usual: the run is not stuck on the bad row.
    ingest.ingest_samples(world.host, [gpu_sample(minute + 61, 0, util=50.0)])
    assert history.downsample(now=minute + 120 + history.GRACE_SECONDS)["rows"] == 1
    assert MetricMinute.objects.count() == 2
