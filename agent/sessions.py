"""Each shell's processes (an SSH session, a browser terminal) in a cgroup of their own, that
none of them can leave: `setsid`, a double fork, `nohup … &` or `disown` change a process's
session, parent or signals, never its cgroup.

The engine starts a session's command behind GATE: the container's /bin/sh stops itself before it
runs the command (nor a profile, nor anything else of the tenant's); the agent makes a cgroup
under the one the engine put it in (the container's, in the cgroup v2 hierarchy), moves it
there, and only then lets it go on. Everything it starts is born in that cgroup. The container
cannot move a process out: no cgroup v2 file system is mounted in it (Podman and Docker mount the
v1 controllers' or their own namespace's, read-only), and the cgroup's files belong to the host's
root, whom no uid of the container's user namespace maps to. When the session ends, its
processes get SIGHUP, and `cgroup.kill` (Linux 5.14) ends whatever is left after the grace."""

import contextlib
import os
import secrets
import signal
import time
from pathlib import Path

GATE = ["/bin/sh", "-c", 'kill -STOP $$ && exec "$@"', "gpucloud-session"]
PREFIX = "gpucloud-session-"
STOP_WAIT_SECONDS = 2.0


class Untracked(Exception):
    """A session whose processes cannot be put in a cgroup of their own: it is not started."""


def _unified_mount() -> Path:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a
    host that mounts v1 controllers beside it)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ", 1)
        if len(fields) == 2 and fields[1].split(" ", 1)[0] == "cgroup2":
            return Path(fields[0].split(" ")[4])
    raise Untracked("this host mounts no cgroup v2 hierarchy")


def _unified_path(pid: int) -> str:
    """The process's cgroup in the v2 hierarchy (the `0::` line of /proc/PID/cgroup)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise Untracked(f"process {pid} is in no cgroup v2")


def _pid_namespace(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/pid").st_ino


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0] == b"T"


class SessionGroup:
    """One session's cgroup."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def enter(cls, pid: int, init: int) -> "SessionGroup":
        """Wait until the session's first process (`pid`, started behind GATE in the container
        whose init is `init`) has stopped itself, move it into a new cgroup of its own, and let
        it go on. Untracked (the process is killed) when it does not stop in time or no cgroup
        can be made; nothing is done to a process outside the container's pid namespace."""
        fd, ours = None, False
        try:
            fd = os.pidfd_open(pid)
            namespace = _pid_namespace(init)
            if _pid_namespace(pid) != namespace or namespace == _pid_namespace(os.getpid()):
                raise Untracked(f"process {pid} is not of the container")
            ours = True
            deadline = time.monotonic() + STOP_WAIT_SECONDS
            while not _stopped(pid):
                if time.monotonic() > deadline:
                    raise Untracked("the session's process did not reach its gate")
                time.sleep(0.005)
            parent = _unified_mount() / _unified_path(pid).lstrip("/")
            group = cls(parent / f"{PREFIX}{secrets.token_hex(8)}")
            group.path.mkdir(mode=0o755)
            if not (group.path / "cgroup.kill").exists():
                group.remove()
                raise Untracked("this kernel has no cgroup.kill (Linux 5.14 or later)")
            try:
                (group.path / "cgroup.procs").write_text(str(pid))
            except OSError:
                group.remove()
                raise
            signal.pidfd_send_signal(fd, signal.SIGCONT)
            return group
        except BaseException:
            if ours:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            raise
        finally:
            if fd is not None:
                os.close(fd)

    def populated(self) -> bool:
        """Whether a process of the session is still alive."""
        try:
            return "populated 1" in (self.path / "cgroup.events").read_text()
        except FileNotFoundError:
            return False

    def hang_up(self) -> bool:
        """SIGHUP to each process of the session; whether there was any. Each is signalled
        through a pidfd once it is seen in the cgroup again, never a pid taken over meanwhile."""
        try:
            pids = (self.path / "cgroup.procs").read_text().split()
        except FileNotFoundError:
            return False
        for pid in pids:
            with contextlib.suppress(OSError):
                fd = os.pidfd_open(int(pid))
                try:
                    if pid in (self.path / "cgroup.procs").read_text().split():
                        signal.pidfd_send_signal(fd, signal.SIGHUP)
                finally:
                    os.close(fd)
        return bool(pids)

    def kill(self) -> None:
        """SIGKILL to every process of the session at once, those it forks meanwhile too."""
        with contextlib.suppress(FileNotFoundError):
            (self.path / "cgroup.kill").write_text("1")

    def remove(self) -> None:
        """The cgroup goes once empty (the container's removal takes it otherwise)."""
        with contextlib.suppress(OSError):
            self.path.rmdir()
