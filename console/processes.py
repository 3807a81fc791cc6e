"""The processes that make up a running gpucloud, as command lines, shared by `make run`
(console.launcher) and the integration tests so that both start exactly the same things."""

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

PYTHON = sys.executable
QUEUES = "default,provisioning,metrics,billing"


def free_port(port: int = 0) -> int:
    """`port` on 127.0.0.1 when it is free (0: any free one), else OSError."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        return sock.getsockname()[1]


def port_or_free(port: int) -> int:
    """`port` when nothing listens on it, else a free one."""
    try:
        return free_port(port)
    except OSError:
        return free_port()


def start_embedded_redis(port: int = 0) -> str:
    """A Redis-protocol server inside this process (fakeredis), for the embedded mode: the
    Celery broker, the Channels layer and the live cache need no installed server."""
    from fakeredis import TcpFakeServer

    class Server(TcpFakeServer):
        def get_request(self):
            # As Redis does: without TCP_NODELAY a reply written in parts (MULTI/EXEC, which
            # Celery's acks and deliveries use) waits for the client's delayed ACK, ~40 ms.
            sock, address = super().get_request()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock, address

    server = Server(("127.0.0.1", port or free_port()), server_type="redis")
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="embedded-redis", daemon=True).start()
    host, bound = server.server_address[:2]
    return f"redis://{host}:{bound}/0"


def start_local_redis(log_path: Path) -> tuple[str, subprocess.Popen | None]:
    """The Redis of `make run` without REDIS_URL: (its URL, its process). A `redis-server` on
    loopback, keeping nothing on disk, where one is installed (it fans out 2,000 live samples
    a second within milliseconds, bench/metrics.py); else the embedded Redis-protocol server
    (no process of its own), which needs nothing installed but keeps up with far less."""
    binary = shutil.which("redis-server")
    if binary is None:
        return start_embedded_redis(), None
    port = free_port()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
             "--appendonly", "no", "--dir", str(log_path.parent)],
            stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C stops the others first; the launcher stops it last
        )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    wait_redis(url, proc)
    return url, proc


def wait_redis(url: str, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Wait until the Redis at `url` (started as `proc`) answers PING, or fail."""
    import redis

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode} before it served")
        try:
            redis.Redis.from_url(url, socket_timeout=2).ping()
            return
        except redis.ConnectionError:
            time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


def web_workers() -> int:
    """How many uvicorn worker processes `make run` starts: WEB_CONCURRENCY, else one per core
    (the Python of one process runs on one core at a time)."""
    return int(os.environ.get("WEB_CONCURRENCY") or os.cpu_count() or 1)


# How long a web process that is asked to stop waits for its open responses: a download
# streamed from an instance's port is cut then (websockets close at once, with 1012), so a
# rolling restart never waits on a tenant's long download (systemd's TimeoutStopSec is 30 s).
WEB_SHUTDOWN_GRACE_SECONDS = 5


def web_cmd(port: int, host: str = "127.0.0.1", workers: int = 1) -> list[str]:
    return [
        PYTHON, "-m", "uvicorn", "console.asgi:application",
        "--host", host, "--port", str(port), "--no-access-log", "--ws", "websockets-sansio",
        "--workers", str(workers),
        "--timeout-graceful-shutdown", str(WEB_SHUTDOWN_GRACE_SECONDS),
    ]  # fmt: skip


def worker_concurrency() -> int:
    """How many task processes `make run`'s worker runs: WORKER_CONCURRENCY, else two per
    core. A launch's task mostly waits on its host's agent (a container start): with one per
    core, a burst of launches queued behind them (bench/launch.py --burst); with four, the
    container starts competed for the cores."""
    return int(os.environ.get("WORKER_CONCURRENCY") or 2 * (os.cpu_count() or 1))


def worker_cmd(concurrency: int = 2, name: str = "worker") -> list[str]:
    return [
        PYTHON, "-m", "celery", "-A", "console", "worker", "-Q", QUEUES,
        "-n", f"{name}@%h", "--concurrency", str(concurrency), "-l", "INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip


def beat_cmd(schedule_dir: Path) -> list[str]:
    return [
        PYTHON, "-m", "celery", "-A", "console", "beat", "-l", "INFO",
        "--schedule", str(schedule_dir / "celerybeat-schedule"),
    ]  # fmt: skip


def agent_cmd(
    server: str,
    state_dir: Path,
    listen: str,
    *,
    join_token: str | None = None,
    hostname: str,
    region: str,
    gpus: int,
    model: str,
    mode: str,
    runtime: str = "sim",
    engine_url: str | None = None,
    ssh_listen: str = "off",
    sample_interval: float = 1.0,
    heartbeat_interval: float = 5.0,
) -> list[str]:
    cmd = [
        PYTHON, "-m", "agent", "--server", server, "--state-dir", str(state_dir),
        "--listen", listen, "--hostname", hostname, "--region", region,
        "--backend", "sim", "--gpus", str(gpus), "--model", model, "--mode", mode,
        "--runtime", runtime, "--sample-interval", str(sample_interval),
        "--heartbeat-interval", str(heartbeat_interval), "--ssh-listen", ssh_listen,
    ]  # fmt: skip
    if join_token:
        cmd += ["--join-token", join_token]
    if engine_url:
        cmd += ["--engine-url", engine_url]
    return cmd


def wait_http(url: str, timeout: float = 30.0, proc=None) -> None:
    """Wait until `url` answers (any status below 500), or fail."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout}s ({last})")


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env
