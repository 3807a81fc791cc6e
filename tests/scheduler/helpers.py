"""Random clusters and requests, and a brute-force oracle written apart from the scheduler."""

import copy
from itertools import combinations

from hypothesis import strategies as st

from console.scheduler.cluster import Cluster
from console.scheduler.fragmentation import stranded
from console.scheduler.mig import STANDARD_PROFILES
from console.scheduler.model import MIG, MILLI, SHARED, WHOLE, Gpu, Node, Placement, Request
from console.scheduler.policies import fits, gpu_rise, milli_left

MODELS = {"a100": 40960, "h100": 81920}  # model code -> GPU memory MiB
REGIONS = ("eu", "us")


@st.composite
def gpus(draw, index: int) -> Gpu:
    model = draw(st.sampled_from(sorted(MODELS)))
    gpu = Gpu(
        index=index,
        model=model,
        mode=draw(st.sampled_from((WHOLE, MIG, SHARED))),
        memory_mib=MODELS[model],
        healthy=draw(st.booleans() | st.just(True)),
    )
    if gpu.mode == WHOLE:
        gpu.taken = draw(st.booleans())
    elif gpu.mode == SHARED:
        gpu.used_milli = draw(st.sampled_from((0, 0, 250, 500, 600, 900, 1000)))
        if gpu.used_milli:
            gpu.used_memory_mib = draw(st.integers(0, gpu.memory_mib))
    else:
        gpu.mig_used = draw(st.integers(0, 255) | st.just(0))
    return gpu


@st.composite
def hosts(draw) -> list[Node]:
    return [
        Node(
            id=f"h{i}",
            region=draw(st.sampled_from(REGIONS)),
            schedulable=draw(st.booleans() | st.just(True)),
            free_cpu_milli=draw(st.sampled_from((0, 4000, 16000, 64000))),
            free_ram_mib=draw(st.sampled_from((0, 16384, 65536, 262144))),
            gpus=[draw(gpus(index)) for index in range(draw(st.integers(0, 5)))],
        )
        for i in range(draw(st.integers(1, 4)))
    ]


@st.composite
def requests(draw) -> Request:
    mode = draw(st.sampled_from((WHOLE, MIG, SHARED)))
    common = {
        "models": draw(st.frozensets(st.sampled_from(sorted(MODELS)))),
        "region": draw(st.none() | st.sampled_from(REGIONS)),
        "cpu_milli": draw(st.sampled_from((0, 2000, 8000, 32000))),
        "ram_mib": draw(st.sampled_from((0, 8192, 65536))),
    }
    if mode == MIG:
        return Request(MIG, mig_profile=draw(st.sampled_from(STANDARD_PROFILES)), **common)
    count = draw(st.integers(0, 3))
    if mode == WHOLE:
        return Request(WHOLE, gpu_count=count, **common)
    milli = MILLI if count > 1 else draw(st.sampled_from((100, 250, 400, 500, 750, 1000)))
    memory = draw(st.sampled_from((0, 0, 10240, 40960)))
    return Request(SHARED, gpu_count=count, milli=milli, gpu_memory_mib=memory, **common)


def feasible(request: Request, all_hosts: list[Node]) -> list[Placement]:
    """Every placement the rules allow, by exhaustive search."""
    found = []
    for host in all_hosts:
        if (
            not host.schedulable
            or host.free_cpu_milli < request.cpu_milli
            or host.free_ram_mib < request.ram_mib
        ):
            continue
        if not request.gpu_count:
            found.append(Placement(request, host.id))
            continue
        usable = [
            g
            for g in host.gpus
            if g.healthy and g.mode == request.mode and request.accepts(g.model, host.region)
        ]
        if request.mode == MIG:
            profile = request.mig_profile
            found += [
                Placement(request, host.id, (g.index,), start)
                for g in usable
                for start in profile.starts
                if not g.mig_used & profile.mask(start)
            ]
            continue
        free = [g for g in usable if _room(g, request)]
        for chosen in combinations(free, request.gpu_count):
            if len({(g.model, g.memory_mib) for g in chosen}) == 1:
                found.append(Placement(request, host.id, tuple(g.index for g in chosen)))
    return found


def _room(gpu: Gpu, request: Request) -> bool:
    if request.mode == WHOLE:
        return not gpu.taken
    return (
        gpu.used_milli + request.milli <= MILLI
        and gpu.used_memory_mib + request.gpu_memory_mib <= gpu.memory_mib
    )


def taken(host: Node, placement: Placement) -> Node:
    """A copy of `host` holding `placement` besides what it holds."""
    host = copy.deepcopy(host)
    request = placement.request
    host.free_cpu_milli -= request.cpu_milli
    host.free_ram_mib -= request.ram_mib
    for gpu in host.gpus:
        if gpu.index in placement.gpu_indexes:
            if request.mode == WHOLE:
                gpu.taken = True
            if request.mode == SHARED:
                gpu.used_milli += request.milli
                gpu.used_memory_mib += request.gpu_memory_mib
            if request.mode == MIG:
                gpu.mig_used |= request.mig_profile.mask(placement.mig_start)
    return host


def index_view(cluster: Cluster) -> dict:
    """The cluster's index as plain data, to compare with a fresh one."""
    view = {
        (group, state): bucket.entries()
        for group, states in cluster.groups.items()
        for state, bucket in states.items()
    }
    view["everyone"] = cluster.everyone.entries()
    view["gpus"] = {host_id: cluster.states_of(host_id) for host_id in cluster.hosts}
    return view


def fgd_everywhere(request: Request, cluster: Cluster) -> Placement | None:
    """fgd the straightforward way: the fragmentation rise of every fitting (host, GPU state)
    of every host, from the same parts as fgd and with its tie-breaks, but no index
    lookups and no pruning."""
    dist = cluster.workload.snapshot()
    best = None
    for order, host in enumerate(cluster.hosts.values()):
        states = cluster.states_of(host.id)
        if (
            states is None
            or host.free_cpu_milli < request.cpu_milli
            or host.free_ram_mib < request.ram_mib
        ):
            continue
        free = sum(gpu.free_units for gpu in host.gpus if gpu.healthy)
        cpu, ram = host.free_cpu_milli, host.free_ram_mib
        after = (free - request.gpu_units, cpu - request.cpu_milli, ram - request.ram_mib)
        change = stranded(*after, dist) - stranded(free, cpu, ram, dist)
        options = [((0.0, None), 0, (), None)]
        if request.gpu_count:
            options = [
                (
                    gpu_rise(request, group, state, dist),
                    milli_left(request, group, state),
                    indexes,
                    state,
                )
                for (group, state), indexes in states.items()
                if fits(request, group, state)
            ]
        for (rise, start), left, indexes, _ in options:
            key = (round(rise + change, 6), left, *after, order, rise)
            if best is None or key < best[0]:
                placement = Placement(request, host.id, tuple(indexes[: request.gpu_count]), start)
                best = (key, placement)
    return None if best is None else best[1]
