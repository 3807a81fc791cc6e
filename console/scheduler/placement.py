"""Where a request goes: first-fit, best-fit, or fgd (fragmentation gradient descent).

    cluster = Cluster(hosts)                  # once; keeps an index and the workload seen
    placement = place(request, cluster)       # None: nothing fits now
    apply(placement, cluster)                 # commit ... and later
    release(placement, cluster)               # give it back

`place`, `apply` and `release` also take a plain list of hosts (indexed for that one call).

- first-fit: the first host (in the order given) that fits, its lowest-numbered GPUs.
- best-fit: the tightest fit: least free capacity left on the chosen GPU, then on the host
  (milli-GPU, then vCPU, then RAM).
- fgd: the placement that raises the host's fragmentation (fragmentation.py) the least,
  ties broken as best-fit breaks them. Each distinct GPU state is scored once per workload
  snapshot; hosts come from the index, and within a bucket only hosts that can lower the
  stranded part are looked at beyond the first that leaves it unchanged.
"""

from collections.abc import Callable, Hashable, Iterable
from dataclasses import replace

from console.scheduler.cluster import Bucket, Cluster, Entry, GroupKey
from console.scheduler.fragmentation import (
    State,
    fed,
    gpu_waste,
    sets_used,
    state_units,
    stranded,
)
from console.scheduler.mig import free_starts
from console.scheduler.model import MIG, SHARED, Host, Placement, Request
from console.scheduler.workload import Distribution

EPSILON = 1e-6  # scores are rounded to 1e-6 milli-GPU so that equal sums compare equal


def place(
    request: Request, cluster: Cluster | Iterable[Host], policy: str = "fgd"
) -> Placement | None:
    """Choose where `request` goes, or None when no host can take it now. Counts the
    request in the cluster's workload (fgd learns the workload from arrivals)."""
    if not isinstance(cluster, Cluster):
        cluster = Cluster(cluster)
    cluster.workload.observe(request)
    return POLICIES[policy](request, cluster)


def apply(placement: Placement, cluster: Cluster | Iterable[Host]) -> None:
    (cluster if isinstance(cluster, Cluster) else Cluster(cluster)).apply(placement)


def release(placement: Placement, cluster: Cluster | Iterable[Host]) -> None:
    (cluster if isinstance(cluster, Cluster) else Cluster(cluster)).release(placement)


def _fits(request: Request, group: GroupKey, state: State) -> bool:
    """Whether a GPU of `group` in `state` (or a set of them) can take `request`."""
    region, mode, model = group
    if mode != request.mode or not request.accepts(model, region):
        return False
    if mode == MIG:
        return bool(free_starts(state[0], request.mig_profile))
    if mode == SHARED:
        memory_ok = state[1] >= request.gpu_memory_mib
        if request.gpu_count == 1:
            return memory_ok and state[0] >= request.milli
        return memory_ok and state[2] >= request.gpu_count
    return state[0] >= request.gpu_count


def _left(request: Request, group: GroupKey | None, state: State | None) -> int:
    """Free milli-GPU left on the chosen GPU: none for whole GPUs and vCPU-only requests."""
    if group is None or request.gpu_count > 1 or group[1] not in (SHARED, MIG):
        return 0
    return state_units(group[1], state) - request.gpu_units


def _candidates(
    request: Request, cluster: Cluster
) -> list[tuple[GroupKey | None, State | None, Bucket]]:
    """The buckets whose GPU state can take `request` (all hosts when it needs no GPU)."""
    if not request.gpu_count:
        return [(None, None, cluster.everyone)]
    return [
        (group, state, bucket)
        for group, states in cluster.groups.items()
        for state, bucket in states.items()
        if _fits(request, group, state)
    ]


def _lowest_start(request: Request, state: State | None) -> int | None:
    return free_starts(state[0], request.mig_profile)[0] if request.mode == MIG else None


def _placement(
    request: Request,
    cluster: Cluster,
    host_id: Hashable,
    group: GroupKey | None,
    state: State | None,
    start: int | None,
) -> Placement:
    if group is None:
        return Placement(request, host_id)
    indexes = cluster.states_of(host_id)[group, state][: request.gpu_count]
    return Placement(request, host_id, tuple(indexes), start)


def first_fit(request: Request, cluster: Cluster) -> Placement | None:
    for host in cluster.hosts.values():
        states = cluster.states_of(host.id)
        if (
            states is None
            or host.free_cpu_milli < request.cpu_milli
            or host.free_ram_mib < request.ram_mib
        ):
            continue
        if not request.gpu_count:
            return Placement(request, host.id)
        fitting = [
            (indexes[: request.gpu_count], state)
            for (group, state), indexes in states.items()
            if _fits(request, group, state)
        ]
        if fitting:
            indexes, state = min(fitting)
            return Placement(request, host.id, tuple(indexes), _lowest_start(request, state))
    return None


def best_fit(request: Request, cluster: Cluster) -> Placement | None:
    units, cpu, ram = request.gpu_units, request.cpu_milli, request.ram_mib
    best = None
    for group, state, bucket in _candidates(request, cluster):
        left = _left(request, group, state)
        for entries in (bucket.slack, bucket.starved):
            entry = next((e for e in entries if e[1] >= cpu and e[2] >= ram), None)
            if entry is not None:
                key = (left, entry[0] - units, entry[1] - cpu, entry[2] - ram, entry[3])
                if best is None or key < best[0]:
                    best = (key, entry[4], group, state)
    if best is None:
        return None
    _, host_id, group, state = best
    return _placement(request, cluster, host_id, group, state, _lowest_start(request, state))


def fgd(request: Request, cluster: Cluster) -> Placement | None:
    dist = cluster.workload.snapshot()
    cluster.track(dist)
    shape = replace(request, cpu_milli=0, ram_mib=0)
    options = []
    for group, state, bucket in _candidates(request, cluster):
        rise, start = 0.0, None
        if group is not None:
            key = (group, state, shape)
            if key not in dist.memo:
                dist.memo[key] = _gpu_rise(request, group, state, dist)
            rise, start = dist.memo[key]
        options.append((rise, _left(request, group, state), start, group, state, bucket))
    options.sort(key=lambda option: option[:2])

    # the stranded part falls by at most this much (the vCPU and RAM taken feed this much)
    floor = -max(0.0, request.gpu_units - fed(request.cpu_milli, request.ram_mib, dist))
    best = None
    for rise, left, start, group, state, bucket in options:
        if best is not None:
            if rise + floor > best[0][0] + EPSILON:
                break
            if not bucket.starved and rise > best[0][0] + EPSILON:
                continue
        found = _best_host(request, bucket, rise, left, floor, dist)
        if found is not None and (best is None or found[0] < best[0]):
            best = (*found, group, state, start)
    return None if best is None else _placement(request, cluster, *best[1:])


def _best_host(
    request: Request, bucket: Bucket, rise: float, left: int, floor: float, dist: Distribution
) -> tuple[tuple, Hashable] | None:
    """The host of `bucket` where the request raises fragmentation least (ties: least free
    capacity left), with its comparison key. Only hosts with stranded capacity can lower
    the stranded part: they are all looked at; of the others, in order, only those up to
    the first that the request leaves without stranded capacity."""
    units, cpu, ram = request.gpu_units, request.cpu_milli, request.ram_mib

    def scan(entries: list[Entry], least: float) -> tuple[tuple, Hashable] | None:
        found = None
        for entry in entries:
            if entry[1] >= cpu and entry[2] >= ram:
                after = (entry[0] - units, entry[1] - cpu, entry[2] - ram)
                change = stranded(*after, dist) - stranded(*entry[:3], dist)
                key = (round(rise + change, 6), left, *after, entry[3])
                if found is None or key < found[0]:
                    found = (key, entry[4])
                if key[0] <= least:  # nothing later in `entries` can beat it
                    break
        return found

    found = scan(bucket.starved, round(rise + floor, 6))
    if found is None or found[0][0] >= round(rise, 6):
        slack = scan(bucket.slack, round(rise, 6))
        if slack is not None and (found is None or slack[0] < found[0]):
            found = slack
    return found


def _gpu_rise(
    request: Request, group: GroupKey, state: State, dist: Distribution
) -> tuple[float, int | None]:
    """How much the per-GPU and per-host-set parts rise when `request` takes a GPU (or a
    set of unused GPUs) in `state`; for MIG, the start that makes the rise least."""
    region, mode, model = group

    def waste(s: State) -> float:
        if (group, s) not in dist.memo:
            dist.memo[group, s] = gpu_waste(mode, model, region, s, dist)
        return dist.memo[group, s]

    if mode == MIG:
        profile = request.mig_profile
        return min(
            (waste((state[0] | profile.mask(s),)) - waste(state), s)
            for s in free_starts(state[0], profile)
        )
    n = request.gpu_count
    unused = state[2] if mode == SHARED else state[0]
    after = 0.0  # a whole GPU, or a shared one given all its milli, has nothing left
    if mode == SHARED and n == 1:
        after = waste((state[0] - request.milli, state[1] - request.gpu_memory_mib, 0))
    sets = sets_used(mode, model, region, unused, n if unused else 0, dist)
    return n * (after - waste(state)) + sets, None


POLICIES: dict[str, Callable[[Request, Cluster], Placement | None]] = {
    "first-fit": first_fit,
    "best-fit": best_fit,
    "fgd": fgd,
}
