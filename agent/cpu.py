"""How much CPU a workload has used: what the sim backend turns into its GPU utilisation, so that
a simulated instance whose container idles shows an idle GPU and one that works shows a busy one.

Both readings are cumulative CPU seconds, read from /proc and the cgroup file system (a few small
files, cheap enough for every sample): a container's whole cgroup (its exec'd shells too), or a
plain process with the children it waited for."""

import os
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
TICKS = os.sysconf("SC_CLK_TCK")


def _cgroup_path(pid: int) -> tuple[str, str] | None:
    """(controller file, cgroup path) of a process's CPU accounting: cgroup v2's unified
    hierarchy, else v1's cpuacct."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            return "cpu.stat", path
        if "cpuacct" in controllers.split(","):
            return "cpuacct.usage", f"cpuacct{path}" if (CGROUP_ROOT / "cpuacct").exists() else path
    return None


def cgroup_seconds(pid: int) -> float | None:
    """CPU seconds used by the cgroup that holds `pid` (a container's init), or None."""
    found = _cgroup_path(pid)
    if found is None:
        return None
    name, path = found
    try:
        text = (CGROUP_ROOT / path.lstrip("/") / name).read_text()
    except OSError:
        return None
    if name == "cpuacct.usage":
        return int(text) / 1e9
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    return None


def process_seconds(pid: int) -> float | None:
    """CPU seconds of a process and of the children it waited for, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    # utime, stime, cutime, cstime: fields 14-17 of stat(5), 11-14 after the name
    return sum(int(value) for value in fields[11:15]) / TICKS


class CpuMeter:
    """The share of one CPU each workload used since its previous reading, in percent (a busy
    loop on one core reads 100). `read(alloc)` answers its cumulative CPU seconds, or None."""

    def __init__(self, read, clock=time.monotonic):
        self.read = read
        self.clock = clock
        self._last: dict[str, tuple[float, float]] = {}

    def percent(self, alloc) -> float | None:
        """None when its CPU cannot be read; 0 at its first reading."""
        seconds = self.read(alloc)
        if seconds is None:
            self._last.pop(alloc.id, None)
            return None
        now = self.clock()
        before = self._last.get(alloc.id)
        self._last[alloc.id] = (now, seconds)
        if before is None or now <= before[0]:
            return 0.0
        return max(0.0, min(100.0, 100 * (seconds - before[1]) / (now - before[0])))

    def forget_others(self, running: set[str]) -> None:
        """Drop the readings of allocations that no longer run."""
        for alloc_id in self._last.keys() - running:
            del self._last[alloc_id]
