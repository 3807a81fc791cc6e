"""GPU backends: `sim` (simulated GPUs) and `nvml` (real GPUs through NVML).

Both answer the calls of `GpuBackend`, the host's contract with them (agent/host.py's
`LocalHost`). The sim backend answers more: fault injection (`inject`) and utilisation that
follows the workloads' CPU use (`follow_cpu`).
"""

from typing import Protocol

from agent.allocations import Allocation
from agent.mig import MigProfile


class GpuBackend(Protocol):
    """What the host asks of its GPUs. A call that cannot be done raises ApiError with why."""

    name: str

    def gpus(self) -> list[dict]:
        """An inventory entry for each GPU, by index: identity, mode, health, MIG devices."""

    def sample(self, allocations: list[Allocation]) -> list[dict]:
        """A sample of every GPU, MIG device and running allocation."""

    def lost_gpus(self) -> set[int]:
        """The indexes of the GPUs that have fallen off the bus."""

    def set_mode(self, index: int, mode: str) -> None:
        """Put a GPU that holds nothing in `mode` (whole, shared or mig)."""

    def ensure_mig(self, index: int, profile: MigProfile, start: int) -> str:
        """The UUID of the MIG device of `profile` at slot `start` of the GPU."""

    def release_mig(self, index: int, mig_uuid: str) -> None:
        """Give back an allocation's MIG device."""
