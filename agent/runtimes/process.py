"""The `process` runtime: a real process per allocation.

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
from typing import NamedTuple

from agent import integers
from agent.allocations import Allocation
from agent.cpu import process_seconds
from agent.runtimes import Exit, LaunchError
from agent.runtimes.output import forget_output, instance_log, tail_lines

DEFAULT_COMMAND = ["sleep", "infinity"]
# what a process workload inherits of the agent's environment: nothing but where programs are
INHERITED_ENV = ("PATH", "LANG", "TZ")
POLL_SECONDS = 0.05
# how long to wait for a process group to vanish after SIGKILL
KILL_WAIT_SECONDS = 5.0
KILL_REAP_SECONDS = 0.5


class Stat(NamedTuple):
    state: str
    group: int
    session: int
    start: int  # clock ticks after boot


def _stat(pid: int) -> Stat | None:
    """A process's /proc/PID/stat, or None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return Stat(fields[0], int(fields[2]), int(fields[3]), int(fields[19]))


def start_time(pid: int) -> int | None:
    stat = _stat(pid)
    return stat.start if stat else None


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    members = []
    for entry in os.scandir("/proc"):
        if integers.PID.fullmatch(entry.name):
            stat = _stat(int(entry.name))
            if stat and stat.group == pgid and stat.state != "Z":
                members.append(int(entry.name))
    return members


class ProcessRuntime:
    name = "process"

    def __init__(self, log_dir: Path, stop_grace: float):
        self.log_dir = log_dir
        self.stop_grace = stop_grace
        self._children: dict[int, subprocess.Popen] = {}

    def launch(self, alloc: Allocation, command, env: dict[str, str], progress):
        """Start the workload (by default `sleep infinity`) with `env` and nothing of the
        agent's environment but PATH; answer (pid, start time)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        inherited = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
        instance = alloc.instance
        try:
            with open(instance_log(self.log_dir, instance), "ab") as log:
                proc = subprocess.Popen(
                    command or DEFAULT_COMMAND,
                    env={**inherited, **env},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as exc:
            reason = "command_not_found" if isinstance(exc, FileNotFoundError) else "launch_failed"
            raise LaunchError(f"{reason}: {exc.strerror or exc}") from exc
        self._children[proc.pid] = proc
        return proc.pid, start_time(proc.pid)

    def _own_stat(self, alloc: Allocation) -> Stat | None:
        """The allocation's process while it lives: not a zombie, and not a reused pid."""
        stat = _stat(alloc.pid) if alloc.pid else None
        return stat if stat and stat.state != "Z" and stat.start == alloc.pid_start else None

    def _alive(self, alloc: Allocation) -> bool:
        return self._own_stat(alloc) is not None

    def cpu_seconds(self, alloc: Allocation) -> float | None:
        """The CPU its process (and the children it waited for) used, while it runs."""
        return process_seconds(alloc.pid) if self._alive(alloc) else None

    def adopt(self, alloc: Allocation) -> bool:
        """Whether a workload of a previous run still runs, still leading its own session."""
        stat = self._own_stat(alloc)
        return stat is not None and stat.session == alloc.pid

    def refresh(self, allocations: list[Allocation]) -> None:
        return None

    def watch(self, on_exit) -> None:
        """Exits are seen by polling: nothing to follow."""
        return None

    def exit_status(self, alloc: Allocation) -> Exit | None:
        """How the workload ended, or None while it runs; the code is None for a process this
        agent did not start. A process killed by signal N reads as exit code 128 + N, as a
        shell says it."""
        proc = self._children.get(alloc.pid)
        if proc is not None:
            code = proc.poll()
            if code is None:
                return None
            del self._children[alloc.pid]
            self._signal(alloc.pid, signal.SIGKILL)  # whatever it left behind in its group
            return Exit(128 - code if code < 0 else code)
        if self._alive(alloc):
            return None
        return Exit(None, "exit_status_unknown")

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
                # a process stuck in the driver may take a while; subprocess reaps it later
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(KILL_REAP_SECONDS)

    def remove(self, alloc: Allocation) -> None:
        return None

    def set_limits(self, alloc: Allocation, resources: dict) -> None:
        """A process workload runs without kernel limits: nothing to change."""
        return None

    def logs(self, instance: str, allocations: list[Allocation], tail: int) -> list[str]:
        """The instance's output on this host (every workload it ran here), most recent last."""
        return tail_lines(instance_log(self.log_dir, instance), tail)

    def delete_instance(self, instance: str) -> None:
        forget_output(self.log_dir, instance)
