"""The console's state for a benchmark's own processes: a fresh folder, out of the way, and
the Redis `make run` would use."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def scratch_var_dir(prefix: str) -> Path:
    """A new GPUCLOUD_VAR_DIR (with its SQLite database) for the console processes this
    process starts and for its own Django, logging at WARNING; answers the folder."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "console.settings",
            "GPUCLOUD_VAR_DIR": str(folder),
            "GPUCLOUD_SQLITE_PATH": str(folder / "bench.sqlite3"),
            "LOG_LEVEL": "WARNING",
        }
    )
    return folder


def make_run_redis(folder: Path) -> tuple[str, subprocess.Popen, str]:
    """The Redis `make run` would use here, in a process of its own: (URL, process, what it is).
    `redis-server` where installed (console.processes.start_local_redis), else the embedded
    Redis-protocol server."""
    from console import processes

    if shutil.which("redis-server"):
        url, proc = processes.start_local_redis(folder / "redis.log")
        return url, proc, "redis-server"
    return (*embedded_redis_process(), "embedded Redis-protocol server")


def embedded_redis_process() -> tuple[str, subprocess.Popen]:
    """The embedded Redis-protocol server (console.processes.start_embedded_redis), which the
    launcher holds in a process that does nothing else: here too, so that it does not compete
    for the bench's GIL. (URL, process)."""
    from console import processes

    port = processes.free_port()
    proc = subprocess.Popen(
        [processes.PYTHON, "-c", "import time; from console.processes import "
         f"start_embedded_redis as s; s({port}); time.sleep(86400)"],
        cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    processes.wait_redis(url, proc)
    return url, proc
