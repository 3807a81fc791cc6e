"""The workload placement plans for: a running histogram of the request shapes that arrived.

Fragmentation is measured against this distribution (Weng et al., ATC'23: "the target
workload"). A shape is a request without its vCPU and RAM; those are kept as totals per shape,
as the vCPU and RAM each shape brings per milli-GPU. Shapes are cut into RATIO_CLASSES
classes of equal arrival share, lightest to heaviest in vCPU and RAM per milli-GPU, and each
class feeds GPUs at its shapes' combined ratio (fragmentation.stranded): one class is the
workload's average, and two see that a host whose vCPU feeds the average request can still
strand its GPUs for the vCPU-heavy half. Scoring works on a frozen snapshot that is taken
again when the histogram has grown by a sixteenth, so that its memoized scores stay valid in
between.
"""

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from console.scheduler.mig import STANDARD_PROFILES
from console.scheduler.model import MIG, MILLI, SHARED, WHOLE, Request

REFRESH_MIN = 8  # arrivals between snapshots, at least
REFRESH_SHARE = 16  # ... and at least 1/16 of all arrivals so far
RATIO_CLASSES = 2  # classes of vCPU and RAM per milli-GPU (fragmentation.stranded)


def default_prior() -> list[Request]:
    """What to expect before anything arrived: common fractions, whole-GPU counts and the
    standard MIG profiles, once each (pseudo-counts that real arrivals soon outweigh)."""
    return [
        *(Request(SHARED, milli=m) for m in (MILLI // 4, MILLI // 2, MILLI)),
        *(Request(WHOLE, gpu_count=n) for n in (1, 2, 4, 8)),
        *(Request(MIG, mig_profile=p) for p in STANDARD_PROFILES),
    ]


# A ratio class: (share of the arrivals, vCPU milli per milli-GPU, RAM MiB per milli-GPU)
Ratio = tuple[float, float, float]


@dataclass(frozen=True)
class Distribution:
    """A frozen view of the workload. `shapes[mode]`: (shape, probability within the mode);
    `ratios`: the ratio classes of the shapes that ask for GPUs, lightest first (a ratio of
    0: that resource is never asked for); `memo`: scores computed under this view, kept by
    whoever computes them."""

    version: int
    shapes: dict[str, tuple[tuple[Request, float], ...]]
    ratios: tuple[Ratio, ...]
    memo: dict = field(default_factory=dict, compare=False, repr=False)


class Workload:
    """Request shapes seen so far, over a prior. `learn=False` keeps the prior as given:
    that is how a caller passes in a workload it knows (e.g. the catalog's specs)."""

    def __init__(self, prior: Iterable[Request] | None = None, learn: bool = True):
        self.learn = learn
        self._counts: Counter[Request] = Counter()
        self._cpu: Counter[Request] = Counter()  # vCPU milli asked for, by shape
        self._ram: Counter[Request] = Counter()  # RAM MiB, by shape
        self._observed = 0
        for request in default_prior() if prior is None else prior:
            self._count(request)
        self._snapshot: Distribution | None = None
        self._next_refresh = 0

    def _count(self, request: Request) -> None:
        if request.gpu_units:
            shape = replace(request, cpu_milli=0, ram_mib=0)
            self._counts[shape] += 1
            self._cpu[shape] += request.cpu_milli
            self._ram[shape] += request.ram_mib
            self._observed += 1

    def observe(self, request: Request) -> None:
        """Count an arrival (a request that asks for no GPU teaches nothing here)."""
        if self.learn:
            self._count(request)

    def snapshot(self) -> Distribution:
        if self._snapshot is None or self._observed >= self._next_refresh:
            by_mode: dict[str, list[tuple[Request, int]]] = {}
            for shape, count in self._counts.items():
                by_mode.setdefault(shape.mode, []).append((shape, count))
            shapes = {
                mode: tuple((shape, count / sum(c for _, c in pairs)) for shape, count in pairs)
                for mode, pairs in by_mode.items()
            }
            version = self._snapshot.version + 1 if self._snapshot else 0
            self._snapshot = Distribution(version, shapes, self._ratios())
            self._next_refresh = self._observed + max(REFRESH_MIN, self._observed // REFRESH_SHARE)
        return self._snapshot

    def _ratios(self) -> tuple[Ratio, ...]:
        """The shapes, lightest first (vCPU and RAM per milli-GPU, each against the
        workload's average), cut into RATIO_CLASSES classes of equal arrival share: a shape
        falls in the class its share's midpoint falls in."""
        units = {shape: count * shape.gpu_units for shape, count in self._counts.items()}
        total_units = sum(units.values())
        average_cpu = sum(self._cpu.values()) / total_units if total_units else 0.0
        average_ram = sum(self._ram.values()) / total_units if total_units else 0.0

        def weight(shape: Request) -> float:
            cpu = self._cpu[shape] / units[shape] / average_cpu if average_cpu else 0.0
            return cpu + (self._ram[shape] / units[shape] / average_ram if average_ram else 0.0)

        arrivals = sum(self._counts.values())
        classes: list[list[Request]] = [[] for _ in range(RATIO_CLASSES)]
        before = 0
        for shape in sorted(self._counts, key=weight):
            count = self._counts[shape]
            middle = (before + count / 2) / arrivals
            classes[min(RATIO_CLASSES - 1, int(middle * RATIO_CLASSES))].append(shape)
            before += count
        ratios = []
        for members in filter(None, classes):
            members_units = sum(units[s] for s in members)
            ratios.append(
                (
                    sum(self._counts[s] for s in members) / arrivals,
                    sum(self._cpu[s] for s in members) / members_units,
                    sum(self._ram[s] for s in members) / members_units,
                )
            )
        return tuple(ratios)
