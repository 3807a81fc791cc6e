"""The workload placement plans for: a running histogram of the request shapes that arrived.

Fragmentation is measured against this distribution (Weng et al., ATC'23: "the target
workload"). A shape is a request without its vCPU and RAM; those are kept as totals, as the
vCPU and RAM the GPU workload brings per milli-GPU. Scoring works on a frozen snapshot that
is taken again when the histogram has grown by a sixteenth, so that its memoized scores
stay valid in between.
"""

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from console.scheduler.mig import STANDARD_PROFILES
from console.scheduler.model import MIG, MILLI, SHARED, WHOLE, Request

REFRESH_MIN = 8  # arrivals between snapshots, at least
REFRESH_SHARE = 16  # ... and at least 1/16 of all arrivals so far


def default_prior() -> list[Request]:
    """What to expect before anything arrived: common fractions, whole-GPU counts and the
    standard MIG profiles, once each (pseudo-counts that real arrivals soon outweigh)."""
    return [
        *(Request(SHARED, milli=m) for m in (MILLI // 4, MILLI // 2, MILLI)),
        *(Request(WHOLE, gpu_count=n) for n in (1, 2, 4, 8)),
        *(Request(MIG, mig_profile=p) for p in STANDARD_PROFILES),
    ]


@dataclass(frozen=True)
class Distribution:
    """A frozen view of the workload. `shapes[mode]`: (shape, probability within the mode);
    `cpu_per_unit`/`ram_per_unit`: vCPU milli and RAM MiB per milli-GPU (0: unknown);
    `memo`: scores computed under this view, kept by whoever computes them."""

    version: int
    shapes: dict[str, tuple[tuple[Request, float], ...]]
    cpu_per_unit: float
    ram_per_unit: float
    memo: dict = field(default_factory=dict, compare=False, repr=False)


class Workload:
    """Request shapes seen so far, over a prior. `learn=False` keeps the prior as given:
    that is how a caller passes in a workload it knows (e.g. the catalog's specs)."""

    def __init__(self, prior: Iterable[Request] | None = None, learn: bool = True):
        self.learn = learn
        self._counts: Counter[Request] = Counter()
        self._cpu = self._ram = self._units = 0
        self._observed = 0
        for request in default_prior() if prior is None else prior:
            self._count(request)
        self._snapshot: Distribution | None = None
        self._next_refresh = 0

    def _count(self, request: Request) -> None:
        if request.gpu_units:
            self._counts[replace(request, cpu_milli=0, ram_mib=0)] += 1
            self._cpu += request.cpu_milli
            self._ram += request.ram_mib
            self._units += request.gpu_units
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
            units = self._units or 1
            version = self._snapshot.version + 1 if self._snapshot else 0
            self._snapshot = Distribution(version, shapes, self._cpu / units, self._ram / units)
            self._next_refresh = self._observed + max(REFRESH_MIN, self._observed // REFRESH_SHARE)
        return self._snapshot
