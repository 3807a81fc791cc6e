"""Workload runtimes: `sim` keeps state only; `process` runs a real process per allocation.

A process workload leads its own session and process group (its pid is the group id), so
stopping it signals every process it started. Its pid and start time are recorded so that a
restarted agent can tell its own surviving workloads from a reused pid.
"""

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from agent.allocations import Allocation

DEFAULT_COMMAND = ["sleep", "infinity"]
POLL_SECONDS = 0.05
# how long to wait for a process group to vanish after SIGKILL
KILL_WAIT_SECONDS = 5.0


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time in clock ticks) of a process, from /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields[0], int(fields[2]), int(fields[19])


def start_time(pid: int) -> int | None:
    stat = _stat(pid)
    return stat[2] if stat else None


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat and stat[1] == pgid and stat[0] != "Z":
                members.append(int(entry.name))
    return members


class SimRuntime:
    """No process: an allocation is state only."""

    name = "sim"

    def launch(self, alloc: Allocation, command: list[str], env: dict[str, str]):
        return None, None

    def adopt(self, alloc: Allocation) -> bool:
        return alloc.pid is None

    def exit_status(self, alloc: Allocation) -> tuple[bool, int | None]:
        return False, None

    async def stop(self, alloc: Allocation) -> int | None:
        return None

    def kill(self, alloc: Allocation) -> None:
        return None


class ProcessRuntime:
    name = "process"

    def __init__(self, log_dir: Path, stop_grace: float):
        self.log_dir = log_dir
        self.stop_grace = stop_grace
        self._children: dict[int, subprocess.Popen] = {}

    def launch(self, alloc: Allocation, command: list[str], env: dict[str, str]):
        """Start the workload; answer (pid, start time). Raises OSError if it cannot start."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{alloc.id}.log", "ab") as log:
            proc = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._children[proc.pid] = proc
        return proc.pid, start_time(proc.pid)

    def _alive(self, alloc: Allocation) -> bool:
        """Whether the allocation's own process still runs (and is not a reused pid)."""
        stat = _stat(alloc.pid)
        return stat is not None and stat[0] != "Z" and stat[2] == alloc.pid_start

    def adopt(self, alloc: Allocation) -> bool:
        return alloc.pid is not None and self._alive(alloc) and os.getsid(alloc.pid) == alloc.pid

    def exit_status(self, alloc: Allocation) -> tuple[bool, int | None]:
        """(exited, exit code); the code is None for a process this agent did not start."""
        proc = self._children.get(alloc.pid)
        if proc is not None:
            code = proc.poll()
            if code is None:
                return False, None
            self._end(alloc.pid, signal.SIGKILL)  # whatever it left behind in its group
            return True, code
        if self._alive(alloc):
            return False, None
        return True, None

    def _end(self, pid: int, sig: int) -> None:
        self._children.pop(pid, None)
        self._signal(pid, sig)

    def _signal(self, pgid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)

    def _gone(self, pgid: int) -> bool:
        proc = self._children.get(pgid)
        if proc is not None:
            proc.poll()
        return not group_members(pgid)

    async def _wait_gone(self, pgid: int, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not self._gone(pgid):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_SECONDS)
        return True

    async def stop(self, alloc: Allocation) -> int | None:
        """SIGTERM to the workload's group, SIGKILL after the grace; answer its exit code."""
        pid = alloc.pid
        owned = pid in self._children or self._alive(alloc)
        if not owned:
            return None
        self._signal(pid, signal.SIGTERM)
        if not await self._wait_gone(pid, self.stop_grace):
            self._signal(pid, signal.SIGKILL)
            await self._wait_gone(pid, KILL_WAIT_SECONDS)
        proc = self._children.pop(pid, None)
        return proc.poll() if proc is not None else None

    def kill(self, alloc: Allocation) -> None:
        """SIGKILL the workload's group at once (its GPU is gone, or it broke its cap)."""
        if alloc.pid in self._children or self._alive(alloc):
            self._signal(alloc.pid, signal.SIGKILL)
            proc = self._children.pop(alloc.pid, None)
            if proc is not None:
                proc.wait()
