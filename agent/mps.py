"""CUDA MPS for shared GPU fractions (real GPUs only): each fraction has an MPS control daemon
of its own, whose server the agent limits through the daemon, never through the workload's
environment, and whose container sees only the socket a CUDA client connects to.

Why a daemon per fraction, not per GPU: a control daemon runs one MPS server at a time, and a
client of another user than the running server's waits until every client of that server is
done (nvidia-cuda-mps-control(1)). Every container's root is its own host user, so fractions
sharing a GPU's daemon would take turns; with a daemon each they run side by side.

The order, for a fraction on GPU <uuid>:
1. the agent starts `nvidia-cuda-mps-control -d` with CUDA_VISIBLE_DEVICES=<uuid> and the
   fraction's own pipe directory;
2. it sets that daemon's defaults, which every server it starts gets:
   `set_default_active_thread_percentage <pct>` and
   `set_default_device_pinned_mem_limit 0 <MiB>M` (device 0: the only one the daemon sees).
   The agent runs as root, so its commands go through the root-only `control_privileged`
   socket;
3. only then is the container created: its first CUDA call connects to the daemon, which starts
   the server for the container's user (the host uid its root maps to) with those limits.
   Whatever user the workload runs as inside, its server has the fraction's limits;
4. on stop the agent sends `quit`, which ends the daemon and its server, and removes the
   fraction's directory.

What the container sees: the daemon's `control` socket, bound read-only at CUDA's default
pipe directory (/tmp/nvidia-mps), and nothing else of the pipe directory (not the root-only
`control_privileged` socket, the server's `log` pipe, `control_lock` or the daemon's pid file).
A client cannot do without `control`: it is where CUDA asks the daemon for its server (the one
rendezvous a client has; nvidia-cuda-mps-control(1)), and the same socket serves the
unprivileged CLI. Through it a tenant reaches only its own daemon.

What MPS does not stop: a process that skips MPS (its pipe directory pointed elsewhere) makes an
ordinary context on the GPU, which runs in the default compute mode so that fractions' servers
can share it. The agent's per-allocation GPU-memory watchdog (LocalHost) is the backstop there.
"""

import logging
import os
import shutil
import subprocess
from pathlib import Path

from agent.allocations import Allocation
from agent.runtimes import LaunchError

log = logging.getLogger(__name__)

# CUDA's default pipe directory, inside the container: a client finds it with no variable set
CLIENT_PIPE = "/tmp/nvidia-mps"  # noqa: S108
COMMAND_TIMEOUT_SECONDS = 15
# the umask an MPS control daemon (and the server it starts) runs with, as a system service
DAEMON_UMASK = 0o022


def limits(shared: dict) -> list[str]:
    """The control daemon's commands that limit every server it starts to the fraction: its
    share of the SMs (whole percent, rounded up) and its memory."""
    percent = -(-shared["milli"] // 10)
    return [
        f"set_default_active_thread_percentage {percent}",
        f"set_default_device_pinned_mem_limit 0 {shared['memory_mib']}M",
    ]


class MpsDaemons:
    """The MPS control daemons of this host's shared fractions, under `root/<allocation>/`."""

    def __init__(self, root: Path):
        self.root = root

    def _pipe(self, alloc: Allocation) -> Path:
        return self.root / alloc.id / "pipe"

    def _control(self, alloc: Allocation, command: str | None) -> None:
        """Send `command` to the fraction's daemon, or start the daemon (None). The daemon
        keeps what it was started with, so its start writes to a file, not to a pipe."""
        control = shutil.which("nvidia-cuda-mps-control")
        if control is None:
            raise LaunchError("launch_failed: nvidia-cuda-mps-control is not installed")
        logs = self.root / alloc.id / "log"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CUDA_VISIBLE_DEVICES": alloc.gpu_uuids[0],
            "CUDA_MPS_PIPE_DIRECTORY": str(self._pipe(alloc)),
            "CUDA_MPS_LOG_DIRECTORY": str(logs),
        }
        output = logs / "command.out"
        with open(output, "w") as out:
            try:
                result = subprocess.run(
                    [control] if command else [control, "-d"],
                    input=f"{command}\n" if command else None,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    text=True,
                    timeout=COMMAND_TIMEOUT_SECONDS,
                    # its server serves the container's user: not the agent's own umask (077)
                    umask=DAEMON_UMASK,
                )
            except subprocess.TimeoutExpired as exc:
                detail = f"launch_failed: MPS of {alloc.id}: {command or 'start'}: no answer"
                raise LaunchError(detail) from exc
        if result.returncode != 0:
            detail = output.read_text().strip() or f"exit code {result.returncode}"
            raise LaunchError(f"launch_failed: MPS of {alloc.id}: {command or 'start'}: {detail}")

    def start(self, alloc: Allocation) -> dict:
        """Start the fraction's daemon with its limits set (one left by an earlier launch is
        ended first); answer the volume that gives the container its client socket."""
        self.stop(alloc)
        pipe = self._pipe(alloc)
        # the server runs as the container's user: it must reach its pipe and log directories
        for path in (self.root, self.root / alloc.id, pipe, self.root / alloc.id / "log"):
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o755)
        self._control(alloc, None)
        try:
            for command in limits(alloc.spec["shared"]):
                self._control(alloc, command)
        except LaunchError:
            self._quit(alloc)  # no server without its limits; its directory keeps control.log
            raise
        log.info("MPS control daemon for %s on GPU %s: %s", alloc.id, alloc.gpu_uuids[0], pipe)
        return {str(pipe / "control"): {"bind": f"{CLIENT_PIPE}/control", "mode": "ro"}}

    def _quit(self, alloc: Allocation) -> None:
        if (self._pipe(alloc) / "control").exists():
            try:
                self._control(alloc, "quit")
            except LaunchError as exc:
                log.warning("%s", exc)

    def stop(self, alloc: Allocation) -> None:
        """End the fraction's daemon and its server, and remove its directory."""
        self._quit(alloc)
        shutil.rmtree(self.root / alloc.id, ignore_errors=True)
