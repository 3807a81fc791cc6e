"""The `sim` runtime: no process, no container; an allocation is state only."""

from agent.allocations import Allocation
from agent.runtimes import Exit


class SimRuntime:
    """No process: an allocation is state only."""

    name = "sim"

    def launch(self, alloc: Allocation, command, env: dict[str, str], progress):
        return None, None

    def adopt(self, alloc: Allocation) -> bool:
        return alloc.pid is None

    def refresh(self, allocations: list[Allocation]) -> None:
        return None

    def watch(self, on_exit) -> None:
        """Exits are seen by polling: nothing to follow."""
        return None

    def exit_status(self, alloc: Allocation) -> Exit | None:
        return None

    def cpu_seconds(self, alloc: Allocation) -> float | None:
        """No process: no CPU to read (the sim backend picks a load instead)."""
        return None

    async def stop(self, alloc: Allocation) -> int | None:
        return None

    def kill(self, alloc: Allocation) -> None:
        return None

    def remove(self, alloc: Allocation) -> None:
        return None

    def set_limits(self, alloc: Allocation, resources: dict) -> None:
        return None

    def logs(self, instance: str, allocations: list[Allocation], tail: int) -> list[str]:
        return []

    def delete_instance(self, instance: str) -> None:
        return None
