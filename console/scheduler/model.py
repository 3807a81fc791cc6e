"""What placement reads and writes: GPUs, hosts, requests and placements.

Plain dataclasses, no Django: the adapter in console.instances builds them from the database.
Units: GPU capacity in milli-GPU (1000 = one GPU), vCPU in milli-CPU, memory in MiB.
"""

from collections.abc import Hashable
from dataclasses import dataclass, field

WHOLE = "whole"
MIG = "mig"
SHARED = "shared"
MODES = (WHOLE, MIG, SHARED)

MILLI = 1000  # milli-GPU in one GPU
MIG_SLICES = 8  # memory slices of a MIG GPU
MILLI_PER_SLICE = MILLI // MIG_SLICES


@dataclass
class Gpu:
    """One physical GPU and what is taken of it, by mode: `taken` (whole), `used_milli` and
    `used_memory_mib` (shared), `mig_used` (bit i set: memory slice i is taken)."""

    index: int
    model: str
    mode: str
    memory_mib: int
    healthy: bool = True
    taken: bool = False
    used_milli: int = 0
    used_memory_mib: int = 0
    mig_used: int = 0

    @property
    def free_units(self) -> int:
        """Free capacity in milli-GPU (a MIG slice counts 125)."""
        if self.mode == WHOLE:
            return 0 if self.taken else MILLI
        if self.mode == SHARED:
            return MILLI - self.used_milli
        return MILLI_PER_SLICE * (MIG_SLICES - self.mig_used.bit_count())


@dataclass
class Node:
    """A GPU host as the scheduler sees it (the console's record is console.fleet.models.Host).
    `schedulable` is False for cordoned, draining, maintenance, unreachable and retired
    hosts; `free_cpu_milli`/`free_ram_mib` are what allocations left free."""

    id: Hashable
    region: str
    schedulable: bool
    free_cpu_milli: int
    free_ram_mib: int
    gpus: list[Gpu] = field(default_factory=list)


@dataclass(frozen=True)
class MigProfile:
    """A MIG instance profile: memory slices it takes and the slices it may start at."""

    name: str
    size: int
    starts: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "starts", tuple(sorted(self.starts)))
        if self.size not in (1, 2, 4, 8) or any(
            s < 0 or s + self.size > MIG_SLICES for s in self.starts
        ):
            raise ValueError(f"bad MIG profile geometry: {self}")

    def mask(self, start: int) -> int:
        """The slice bitmask an instance started at `start` takes."""
        return ((1 << self.size) - 1) << start


@dataclass(frozen=True)
class Request:
    """What an instance needs. `models` empty: any GPU model; `region` None: any region.

    - whole: `gpu_count` free whole-mode GPUs of one model on one host;
    - shared: `gpu_count` shared-mode GPUs of one model on one host, each giving `milli`
      and `gpu_memory_mib`; more than one GPU only as whole GPUs (`milli` 1000);
    - mig: one instance of `mig_profile` on one MIG-mode GPU;
    - `gpu_count` 0 (whole or shared): vCPU and RAM only.
    """

    mode: str
    models: frozenset[str] = frozenset()
    region: str | None = None
    gpu_count: int = 1
    milli: int = 0
    gpu_memory_mib: int = 0
    mig_profile: MigProfile | None = None
    cpu_milli: int = 0
    ram_mib: int = 0

    def __post_init__(self):
        models = self.models
        object.__setattr__(
            self, "models", frozenset([models] if isinstance(models, str) else models)
        )
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}")
        if min(self.gpu_count, self.milli, self.gpu_memory_mib, self.cpu_milli, self.ram_mib) < 0:
            raise ValueError("a request asks for no negative amount")
        if self.mode == MIG and (self.mig_profile is None or self.gpu_count != 1):
            raise ValueError("a MIG request is one instance of a MIG profile")
        if self.mode != MIG and self.mig_profile is not None:
            raise ValueError("only a MIG request has a MIG profile")
        if self.mode == SHARED and self.gpu_count:
            if not 0 < self.milli <= MILLI:
                raise ValueError("a shared request takes 1..1000 milli-GPU of each GPU")
            if self.gpu_count > 1 and self.milli != MILLI:
                raise ValueError("a shared request spans several GPUs only as whole GPUs")

    @property
    def gpu_units(self) -> int:
        """Milli-GPU the request takes in all (a MIG slice counts 125)."""
        if self.mode == MIG:
            return MILLI_PER_SLICE * self.mig_profile.size
        return self.gpu_count * (self.milli if self.mode == SHARED else MILLI)

    def accepts(self, model: str, region: str) -> bool:
        return (not self.models or model in self.models) and self.region in (None, region)


@dataclass(frozen=True)
class Placement:
    """Where a request goes: the host, its GPUs by index and, for MIG, the start slice.
    The request rides along so that the placement can be applied and released alone."""

    request: Request
    host_id: Hashable
    gpu_indexes: tuple[int, ...] = ()
    mig_start: int | None = None

    @property
    def milli(self) -> int:
        return self.request.milli

    @property
    def gpu_memory_mib(self) -> int:
        return self.request.gpu_memory_mib
