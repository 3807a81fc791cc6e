"""Workload runtimes: `sim` keeps state only; `process` runs a real process per allocation;
`oci` runs a container per allocation, through the Docker Engine API.

Every runtime answers the calls of `Runtime`, the host's contract with it (agent/host.py's
`LocalHost`). The oci runtime answers more: the data plane enters its containers
(`running_container`, `exec_open`, …) and it keeps disks (`disks`); those who need them look
for them.
"""

from collections.abc import Callable
from typing import NamedTuple, Protocol

from agent.allocations import Allocation


class LaunchError(Exception):
    """The workload could not start; the message is the allocation's failure reason."""


class Exit(NamedTuple):
    """How a workload ended: its code (None when unknown), a reason where the code does not
    say it all (oom_killed, container_lost), and when (ISO time, None: when it was seen)."""

    code: int | None
    reason: str | None = None
    at: str | None = None


class Runtime(Protocol):
    """What the host asks of its runtime. The calls that may block (launch, refresh, set_limits,
    remove, logs, delete_instance) are run in a worker thread by the host; `stop` is a
    coroutine."""

    name: str

    def launch(
        self,
        alloc: Allocation,
        command: list[str] | None,
        env: dict[str, str],
        progress: Callable[..., None],
    ) -> tuple[int | None, int | None]:
        """Start the workload; answer its (pid, start time), either None where the runtime has
        none. Raises LaunchError with the reason when it cannot run. `progress(text, figures=
        None)` tells how far it got; an image pull adds its figures (agent/pulls.py)."""

    def adopt(self, alloc: Allocation) -> bool:
        """Whether a workload of a previous run of the agent is still there to take back."""

    def refresh(self, allocations: list[Allocation]) -> None:
        """Read the state of the running workloads (what `exit_status` then answers from)."""

    def watch(self, on_exit: Callable[[], None]) -> None:
        """Call `on_exit()` whenever a workload may have ended, where the runtime hears of it."""

    def exit_status(self, alloc: Allocation) -> Exit | None:
        """How the workload ended, or None while it runs."""

    def cpu_seconds(self, alloc: Allocation) -> float | None:
        """The CPU time the workload has used, None where it cannot be read."""

    async def stop(self, alloc: Allocation) -> int | None:
        """Stop the workload (a grace, then a kill); answer its exit code where known."""

    def kill(self, alloc: Allocation) -> None:
        """End the workload at once (its GPU is gone, or it broke its cap)."""

    def remove(self, alloc: Allocation) -> None:
        """Remove what a stopped workload left (its container)."""

    def set_limits(self, alloc: Allocation, resources: dict) -> None:
        """Apply new CPU, memory and pids limits to the running workload."""

    def logs(self, instance: str, allocations: list[Allocation], tail: int) -> list[str]:
        """The last `tail` lines of the instance's output on this host."""

    def delete_instance(self, instance: str) -> None:
        """Remove what outlives an instance's workloads here (its kept output, its disk)."""
