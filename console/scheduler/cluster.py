"""A placement state that stays indexed while placements are applied and released.

Hosts are indexed by the state of their GPUs: for each (region, mode, model) a bucket per GPU
state (see fragmentation.State) holding the hosts that have a GPU in that state, sorted by
(free milli-GPU, free vCPU, free RAM, host order) — the order best-fit wants, and the
tie-break of fgd. A bucket keeps apart the hosts with stranded GPU capacity under the
workload snapshot last tracked: only there can a placement lower the stranded part of
fragmentation. Those it keeps by kind, what they have free (a Kind), since hosts of one kind
score alike and the lowest-ordered wins their ties: most of a cluster's hosts strand
something for its vCPU-heavy requests, and they come in far fewer kinds (a tenth, on the
Alibaba trace). The kinds are sorted most free vCPU first, so that a request's scan of them
ends where the vCPU runs out. Placement looks buckets up; it never scans all GPUs.

For fgd, each request shape keeps its candidate GPU states ranked by how much the shape
raises their fragmentation (a Ranking), under the workload snapshot last tracked: a state
is scored once when its bucket first appears, and fgd reads the ranking from the top and
stops early, so that a request's cost does not grow with the number of GPU states (which
grows with the number of distinct fractions the workload asks for).
"""

from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from console.scheduler.fragmentation import State, gpu_state, stranded, unused_counts
from console.scheduler.model import MIG, MILLI, SHARED, Gpu, Node, Placement, Request
from console.scheduler.workload import Distribution, Workload

# (free milli-GPU, free vCPU milli, free RAM MiB, host order, host id)
Entry = tuple[int, int, int, int, Hashable]
Kind = tuple[int, int, int]  # an Entry's first three: what a host has free
GroupKey = tuple[str, str, str]  # (region, mode, model)
LOG_MIN = 1024  # buckets created before the rankings may be started again


def by_cpu(kind: Kind) -> tuple[int, Kind]:
    """The order of a bucket's kinds of hosts with stranded capacity: most free vCPU first,
    so that a scan stops at the first kind that lacks the vCPU."""
    return -kind[1], kind


# A candidate of a Ranking: (rise, free milli-GPU left on the GPU, MIG start, group, state)
Option = tuple[float, int, int | None, GroupKey, State]


@dataclass
class Ranking:
    """One shape's candidate GPU states, least rise first: every state whose bucket existed
    while the ranking was kept up to date (an emptied bucket's entry stays and is skipped).
    `seen`: how much of the cluster's log of created buckets is taken in."""

    options: list[Option] = field(default_factory=list)
    keys: set[tuple[GroupKey, State]] = field(default_factory=set)
    seen: int = 0


@dataclass
class Bucket:
    """Hosts with a GPU in one state: those with no stranded capacity under the tracked
    workload snapshot in Entry order (`slack`), and those with some by kind (`kinds`: their
    (host order, host id), lowest first), the kinds sorted by_cpu (`starved`)."""

    slack: list[Entry] = field(default_factory=list)
    starved: list[Kind] = field(default_factory=list)
    kinds: dict[Kind, list[tuple[int, Hashable]]] = field(default_factory=dict)

    def add(self, entry: Entry, starved: bool) -> None:
        if not starved:
            insort(self.slack, entry)
            return
        kind, host = entry[:3], entry[3:]
        hosts = self.kinds.get(kind)
        if hosts is None:
            self.kinds[kind] = [host]
            insort(self.starved, kind, key=by_cpu)
        else:
            insort(hosts, host)

    def remove(self, entry: Entry) -> None:
        i = bisect_left(self.slack, entry)
        if i < len(self.slack) and self.slack[i] == entry:
            del self.slack[i]
            return
        kind = entry[:3]
        hosts = self.kinds[kind]
        hosts.remove(entry[3:])
        if not hosts:
            del self.kinds[kind]
            del self.starved[bisect_left(self.starved, by_cpu(kind), key=by_cpu)]

    def first(self, kind: Kind) -> Entry:
        """The lowest-ordered host of a kind of the starved ones."""
        return (*kind, *self.kinds[kind][0])

    def entries(self) -> list[Entry]:
        """Every host, in Entry order."""
        starved = [(*kind, *host) for kind, hosts in self.kinds.items() for host in hosts]
        return sorted(self.slack + starved)

    def sort(self, starved: Callable[[Entry], bool]) -> None:
        """Keep apart again the hosts with stranded capacity, as `starved` says."""
        entries = self.entries()
        self.slack, self.kinds = [], {}
        for entry in entries:
            if starved(entry):
                self.kinds.setdefault(entry[:3], []).append(entry[3:])
            else:
                self.slack.append(entry)
        self.starved = sorted(self.kinds, key=by_cpu)


class Cluster:
    """Hosts (mutated in place by apply/release), their index and the workload seen."""

    def __init__(self, hosts: Iterable[Node], workload: Workload | None = None):
        self.hosts = {host.id: host for host in hosts}
        self.workload = workload or Workload()
        self.groups: dict[GroupKey, dict[State, Bucket]] = {}
        self.everyone = Bucket()  # every schedulable host, for requests without GPUs
        self._order = {host_id: i for i, host_id in enumerate(self.hosts)}
        self._entries: dict[Hashable, Entry] = {}
        self._gpus: dict[Hashable, dict[tuple[GroupKey, State], list[int]]] = {}
        self._dist: Distribution | None = None
        # (group, state) of each bucket created, in order, and each shape's ranking of
        # them: both dropped when the snapshot changes or the log outgrows the buckets
        self.created: list[tuple[GroupKey, State]] = []
        self.rankings: dict[Request, Ranking] = {}
        # free milli-GPU of each indexed host that its free vCPU and RAM cannot feed under
        # the tracked workload snapshot (0 before any)
        self.stranded: dict[Hashable, float] = {}
        for host in self.hosts.values():
            self._index(host)

    def states_of(self, host_id: Hashable) -> dict[tuple[GroupKey, State], list[int]] | None:
        """GPU indexes (lowest first) of an indexed host by (group, state); None for hosts
        not indexed (not schedulable)."""
        return self._gpus.get(host_id)

    def refresh(self, host_id: Hashable) -> None:
        """Index a host again after changes made outside apply/release (a host cordoned, a
        GPU marked unhealthy or its mode changed, usage mended by reconcile)."""
        self._unindex(host_id)
        self._index(self.hosts[host_id])

    def track(self, dist: Distribution) -> None:
        """Mark the hosts with stranded capacity under `dist` (again when it changed)."""
        if dist is self._dist:
            return
        self._dist = dist
        self.created, self.rankings = [], {}
        self.stranded = {host_id: self._stranded(e) for host_id, e in self._entries.items()}
        for bucket in self._buckets():
            bucket.sort(lambda entry: self.stranded[entry[4]] > 0)

    def apply(self, placement: Placement) -> None:
        """Commit `placement`; ValueError (and nothing changed) when it does not fit."""
        host = self.hosts[placement.host_id]
        request = placement.request
        if not host.schedulable:
            raise ValueError(f"host {host.id} takes no new placements")
        if host.free_cpu_milli < request.cpu_milli or host.free_ram_mib < request.ram_mib:
            raise ValueError(f"host {host.id} lacks the vCPU or RAM")
        gpus = self._chosen(host, placement)
        for gpu in gpus:
            if not gpu.healthy or not request.accepts(gpu.model, host.region):
                raise ValueError(f"GPU {gpu.index} of host {host.id} is not for this request")
            if not _free_for(gpu, placement):
                raise ValueError(f"GPU {gpu.index} of host {host.id} is taken")
        self._change(host, placement, gpus, 1)

    def release(self, placement: Placement) -> None:
        """Give back what `placement` took; ValueError when it does not hold it."""
        host = self.hosts[placement.host_id]
        gpus = self._chosen(host, placement)
        for gpu in gpus:
            if not _held_by(gpu, placement):
                raise ValueError(f"GPU {gpu.index} of host {host.id} does not hold this")
        self._change(host, placement, gpus, -1)

    def _chosen(self, host: Node, placement: Placement) -> list[Gpu]:
        request = placement.request
        by_index = {gpu.index: gpu for gpu in host.gpus}
        indexes = placement.gpu_indexes
        if len(set(indexes)) != len(indexes) or len(indexes) != request.gpu_count:
            raise ValueError(f"{request.gpu_count} distinct GPUs expected, got {indexes}")
        gpus = [by_index[i] for i in indexes if i in by_index]
        if len(gpus) != len(indexes) or any(g.mode != request.mode for g in gpus):
            raise ValueError(f"host {host.id} has no {request.mode} GPUs {indexes}")
        if len({g.model for g in gpus}) > 1:
            raise ValueError("the GPUs of one request are of one model")
        starts = request.mig_profile.starts if request.mode == MIG else (None,)
        if placement.mig_start not in starts:
            raise ValueError(f"start {placement.mig_start} does not suit {request}")
        return gpus

    def _change(self, host: Node, placement: Placement, gpus: list[Gpu], sign: int) -> None:
        self._unindex(host.id)
        request = placement.request
        host.free_cpu_milli -= sign * request.cpu_milli
        host.free_ram_mib -= sign * request.ram_mib
        for gpu in gpus:
            if request.mode == SHARED:
                gpu.used_milli += sign * request.milli
                gpu.used_memory_mib += sign * request.gpu_memory_mib
            elif request.mode == MIG:
                mask = request.mig_profile.mask(placement.mig_start)
                gpu.mig_used = gpu.mig_used | mask if sign > 0 else gpu.mig_used & ~mask
            else:
                gpu.taken = sign > 0
        self._index(host)

    def _stranded(self, entry: Entry) -> float:
        return 0.0 if self._dist is None else stranded(*entry[:3], self._dist)

    def _buckets(self) -> Iterable[Bucket]:
        yield self.everyone
        for states in self.groups.values():
            yield from states.values()

    def _index(self, host: Node) -> None:
        if not host.schedulable:
            return
        gpus = [gpu for gpu in host.gpus if gpu.healthy]
        unused = unused_counts(gpus)
        states: dict[tuple[GroupKey, State], list[int]] = {}
        for gpu in sorted(gpus, key=lambda g: g.index):
            state = gpu_state(gpu, unused)
            if state is not None:
                group = (host.region, gpu.mode, gpu.model)
                states.setdefault((group, state), []).append(gpu.index)
        free = sum(gpu.free_units for gpu in gpus)
        entry = (free, host.free_cpu_milli, host.free_ram_mib, self._order[host.id], host.id)
        self.stranded[host.id] = self._stranded(entry)
        starved = self.stranded[host.id] > 0
        self.everyone.add(entry, starved)
        for group, state in states:
            buckets = self.groups.setdefault(group, {})
            if state not in buckets:
                buckets[state] = Bucket()
                self._created(group, state)
            buckets[state].add(entry, starved)
        self._entries[host.id] = entry
        self._gpus[host.id] = states

    def _created(self, group: GroupKey, state: State) -> None:
        self.created.append((group, state))
        # rankings keep emptied buckets' entries: start them again once those may dominate
        if len(self.created) > max(LOG_MIN, 2 * sum(map(len, self.groups.values()))):
            self.created, self.rankings = [], {}

    def _unindex(self, host_id: Hashable) -> None:
        entry = self._entries.pop(host_id, None)
        if entry is None:
            return
        del self.stranded[host_id]
        self.everyone.remove(entry)
        for group, state in self._gpus.pop(host_id):
            bucket = self.groups[group][state]
            bucket.remove(entry)
            if not bucket.slack and not bucket.starved:
                del self.groups[group][state]


def _free_for(gpu: Gpu, placement: Placement) -> bool:
    request = placement.request
    if request.mode == SHARED:
        return (
            gpu.used_milli + request.milli <= MILLI
            and gpu.used_memory_mib + request.gpu_memory_mib <= gpu.memory_mib
        )
    if request.mode == MIG:
        return not gpu.mig_used & request.mig_profile.mask(placement.mig_start)
    return not gpu.taken


def _held_by(gpu: Gpu, placement: Placement) -> bool:
    request = placement.request
    if request.mode == SHARED:
        return gpu.used_milli >= request.milli and gpu.used_memory_mib >= request.gpu_memory_mib
    if request.mode == MIG:
        mask = request.mig_profile.mask(placement.mig_start)
        return gpu.mig_used & mask == mask
    return gpu.taken
