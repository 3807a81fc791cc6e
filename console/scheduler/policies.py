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
  snapshot and request shape, into the shape's ranking (cluster.Ranking), read least rise
  first until no state can beat the best so far; hosts come from the index, and within a
  bucket only hosts that can lower the stranded part are looked at beyond the first that
  leaves it unchanged, one of each kind (what it has free).
"""

import itertools
from bisect import insort
from collections.abc import Callable, Hashable, Iterable
from dataclasses import replace

from console.scheduler.cluster import Bucket, Cluster, GroupKey, Option, Ranking
from console.scheduler.fragmentation import (
    State,
    gpu_waste,
    least_change,
    sets_used,
    state_units,
    stranded,
)
from console.scheduler.mig import free_starts
from console.scheduler.model import MIG, SHARED, Node, Placement, Request
from console.scheduler.workload import Distribution

EPSILON = 1e-6  # scores are rounded to 1e-6 milli-GPU so that equal sums compare equal
INFINITY = float("inf")
NO_GPU: Option = (0.0, 0, None, None, None)  # the one option of a vCPU-only request


def place(
    request: Request, cluster: Cluster | Iterable[Node], policy: str = "fgd"
) -> Placement | None:
    """Choose where `request` goes, or None when no host can take it now. Counts the
    request in the cluster's workload (fgd learns the workload from arrivals)."""
    if not isinstance(cluster, Cluster):
        cluster = Cluster(cluster)
    cluster.workload.observe(request)
    return POLICIES[policy](request, cluster)


def apply(placement: Placement, cluster: Cluster | Iterable[Node]) -> None:
    (cluster if isinstance(cluster, Cluster) else Cluster(cluster)).apply(placement)


def release(placement: Placement, cluster: Cluster | Iterable[Node]) -> None:
    (cluster if isinstance(cluster, Cluster) else Cluster(cluster)).release(placement)


def fits(request: Request, group: GroupKey, state: State) -> bool:
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


def milli_left(request: Request, group: GroupKey | None, state: State | None) -> int:
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
        if fits(request, group, state)
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
            if fits(request, group, state)
        ]
        if fitting:
            indexes, state = min(fitting)
            return Placement(request, host.id, tuple(indexes), _lowest_start(request, state))
    return None


def best_fit(request: Request, cluster: Cluster) -> Placement | None:
    units, cpu, ram = request.gpu_units, request.cpu_milli, request.ram_mib
    best = None
    for group, state, bucket in _candidates(request, cluster):
        left = milli_left(request, group, state)
        slack = next((e for e in bucket.slack if e[1] >= cpu and e[2] >= ram), None)
        fed = itertools.takewhile(lambda kind: kind[1] >= cpu, bucket.starved)  # most vCPU first
        kind = min((kind for kind in fed if kind[2] >= ram), default=None)
        starved = None if kind is None else bucket.first(kind)
        for entry in (slack, starved):
            if entry is not None:
                key = (left, entry[0] - units, entry[1] - cpu, entry[2] - ram, entry[3])
                if best is None or key < best[0]:
                    best = (key, entry[4], group, state)
    if best is None:
        return None
    _, host_id, group, state = best
    return _placement(request, cluster, host_id, group, state, _lowest_start(request, state))


def fgd(request: Request, cluster: Cluster) -> Placement | None:
    """The least (score, best-fit's key) by bucket, the buckets in order of their rise: in
    each, every kind of host with stranded capacity (the request may lower it) and the vCPU
    and RAM, by its lowest-ordered host, and of the others, in order, those up to the first
    that the request leaves without stranded capacity; no bucket after the first whose rise
    cannot beat the best so far."""
    dist = cluster.workload.snapshot()
    cluster.track(dist)
    shape = replace(request, cpu_milli=0, ram_mib=0)
    units, cpu, ram = request.gpu_units, request.cpu_milli, request.ram_mib
    groups = cluster.groups
    options = _ranked(shape, cluster, dist) if request.gpu_count else [NO_GPU]
    floor = least_change(units, cpu, ram, dist)  # the stranded part falls by at most this
    before = cluster.stranded
    best = None  # (key, host, group, state, MIG start, rise)
    for rise, left, start, group, state in options:
        if best is not None and rise + floor > best[0][0] + EPSILON:
            break
        bucket = cluster.everyone if group is None else groups[group].get(state)
        if bucket is None:  # emptied since it was ranked
            continue
        if best is not None and not bucket.starved and rise > best[0][0] + EPSILON:
            continue
        # kinds of hosts with stranded capacity, most vCPU first: all that have the vCPU
        # and RAM, each by its lowest-ordered host; of their scores, only those that may tie
        # the least (and the best so far) are rounded and compared in full
        limit = INFINITY if best is None else best[0][0] + EPSILON
        near = []
        for kind in bucket.starved:
            free, free_cpu, free_ram = kind
            if free_cpu < cpu:
                break
            if free_ram < ram:
                continue
            order, host_id = bucket.kinds[kind][0]
            had = before[host_id]
            if rise - had > limit:  # the stranded part falls at most to 0
                continue
            after = stranded(free - units, free_cpu - cpu, free_ram - ram, dist)
            raw = rise + (after - had)
            if raw <= limit:
                near.append((raw, kind, order, host_id))
                limit = min(limit, raw + EPSILON)
        found = None
        for raw, (free, free_cpu, free_ram), order, host_id in near:
            if raw <= limit:
                key = (round(raw, 6), left, free - units, free_cpu - cpu, free_ram - ram, order)
                if found is None or key < found[0]:
                    found = (key, host_id)
        # the others in Entry order, up to the first left without stranded capacity
        least = round(rise, 6)
        if found is None or found[0][0] >= least:
            for free, free_cpu, free_ram, order, host_id in bucket.slack:
                if free_cpu < cpu or free_ram < ram:
                    continue
                after = stranded(free - units, free_cpu - cpu, free_ram - ram, dist)
                score = round(rise + after, 6)
                key = (score, left, free - units, free_cpu - cpu, free_ram - ram, order)
                if found is None or key < found[0]:
                    found = (key, host_id)
                if score <= least:
                    break
        if found is not None:
            found = (*found, group, state, start, rise)
            if (
                best is None
                or found[0] < best[0]
                or found[0] == best[0]
                and _tie(found, best, cluster)
            ):
                best = found
    return None if best is None else _placement(request, cluster, *best[1:5])


def _ranked(shape: Request, cluster: Cluster, dist: Distribution) -> list[Option]:
    """The GPU states that can take `shape`, least rise first (cluster.Ranking): scored
    when first met, from the buckets there are or those created since the last call."""
    ranking = cluster.rankings.get(shape)
    if ranking is None:
        ranking = cluster.rankings[shape] = Ranking()
        new = [(group, state) for group, states in cluster.groups.items() for state in states]
    else:
        new = cluster.created[ranking.seen :]
    ranking.seen = len(cluster.created)
    for group, state in new:
        if (group, state) not in ranking.keys:
            ranking.keys.add((group, state))
            if fits(shape, group, state):
                rise, start = gpu_rise(shape, group, state, dist)
                insort(
                    ranking.options, (rise, milli_left(shape, group, state), start, group, state)
                )
    return ranking.options


def _tie(option: tuple, best: tuple, cluster: Cluster) -> bool:
    """Between two GPU states of one host that score alike: the lesser rise, then the
    lowest-numbered GPUs."""
    states = cluster.states_of(option[1])
    return (option[5], states[option[2], option[3]]) < (best[5], states[best[2], best[3]])


def gpu_rise(
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
