"""Real processes for integration tests: the ASGI server, Celery workers and host agents,
started from the same command lines as `make run` (console.processes)."""

import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from django.db import connection

from console import processes


def database_env() -> dict[str, str]:
    """Environment that points a child process at the test database this process uses."""
    sd = connection.settings_dict
    if connection.vendor == "sqlite":
        return {"DATABASE_URL": "", "GPUCLOUD_SQLITE_PATH": str(sd["NAME"])}
    auth = sd["USER"] + (f":{sd['PASSWORD']}" if sd["PASSWORD"] else "")
    return {"DATABASE_URL": f"postgres://{auth}@{sd['HOST']}:{sd['PORT'] or 5432}/{sd['NAME']}"}


class Proc:
    """A child process in its own process group, its output in a log file."""

    def __init__(
        self, name: str, cmd: list[str], env: dict[str, str], log_dir: Path, cwd: str | None = None
    ):
        self.name = name
        self.cmd = cmd
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            cmd,
            env=env,
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self):
        return self.popen.poll()

    @property
    def returncode(self):
        return self.popen.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return
            if self.popen.poll() is not None:
                break
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} did not log {text!r}:\n{self.log()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the whole process group: a crash, as far as the process can tell."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=timeout)
            except ProcessLookupError:
                pass
        self._log.close()


class Stack:
    """A running control plane (ASGI server + Celery worker) on the test database, plus the
    host agents a test starts on it."""

    def __init__(self, redis_url: str, log_dir: Path):
        self.log_dir = log_dir
        self.env = processes.child_env(REDIS_URL=redis_url, **database_env())
        self.port = processes.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: list[Proc] = []
        # each agent's API and SSH ports, by its state directory: an agent started again is the
        # same host at the same address (a host's address is fixed at its join)
        self.agent_ports: dict[Path, tuple[int, int]] = {}
        self.web = self.start("web", processes.web_cmd(self.port))
        self.worker = self.start_worker()
        try:
            processes.wait_http(f"{self.url}/healthz", proc=self.web.popen)
            self.worker.wait_for_log("ready.")
        except Exception:
            print(self.logs())
            self.stop()  # a stack that did not come up leaves no process behind
            raise

    def start(self, name: str, cmd: list[str], **env: str) -> Proc:
        proc = Proc(name, cmd, {**self.env, **env}, self.log_dir)
        self.procs.append(proc)
        return proc

    def start_worker(self, name: str = "worker", concurrency: int = 2) -> Proc:
        return self.start(name, processes.worker_cmd(concurrency=concurrency, name=name))

    def start_agent(
        self,
        hostname: str,
        *,
        region: str,
        gpus: int = 4,
        model: str = "a100-80gb",
        mode: str = "mig",
        runtime: str = "sim",
        engine_url: str | None = None,
        join_token: str | None = None,
        state_dir: Path | None = None,
        sample_interval: float = 0.5,
        heartbeat_interval: float = 0.5,
    ) -> Proc:
        state_dir = state_dir or self.log_dir / f"agent-{hostname}"
        api_port, ssh_port = self.agent_ports.setdefault(
            state_dir, (processes.free_port(), processes.free_port())
        )
        listen = f"127.0.0.1:{api_port}"
        cmd = processes.agent_cmd(
            self.url,
            state_dir,
            listen,
            join_token=join_token,
            hostname=hostname,
            region=region,
            gpus=gpus,
            model=model,
            mode=mode,
            runtime=runtime,
            engine_url=engine_url,
            ssh_listen=f"127.0.0.1:{ssh_port}",
            sample_interval=sample_interval,
            heartbeat_interval=heartbeat_interval,
        )
        return self.start(f"agent-{hostname}", cmd)

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} =====\n{p.log()[-4000:]}" for p in self.procs)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


@contextmanager
def running_stack(redis_url: str, log_dir: Path, node):
    """A Stack for one test; its processes' logs are printed when the test failed."""
    stack = Stack(redis_url, log_dir)
    try:
        yield stack
    finally:
        stack.stop()
        report = getattr(node, "rep_call", None)
        if report is not None and report.failed:
            print(stack.logs())
