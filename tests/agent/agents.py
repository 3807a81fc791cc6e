"""Real agent processes for the agent's tests: `python -m agent` on a free loopback port."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from agent.runtimes.process import start_time

REPO = Path(__file__).resolve().parents[2]
SECRET = "agent-test-secret"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05):
    """Poll `predicate` until it answers something truthy; answer that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {predicate}")
        time.sleep(interval)


@contextlib.contextmanager
def standalone(state_dir: Path, *args: str):
    """A standalone agent (the test secret) with `args`, ready, killed at the end."""
    agent = Agent(state_dir, args, SECRET)
    try:
        agent.wait_ready()
        yield agent
    finally:
        agent.kill()
        agent.client.close()


class Agent:
    """A `python -m agent` subprocess; standalone with `secret`, else registering."""

    def __init__(
        self, state_dir: Path, args: tuple[str, ...], secret: str | None, listen="127.0.0.1"
    ):
        """`listen`: the address the API and the SSH gateway listen on."""
        self.state_dir = state_dir
        self.port = free_port()
        self.ssh_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = state_dir.parent / f"agent-{self.port}.log"
        cmd = [
            sys.executable,
            "-m",
            "agent",
            "--listen",
            f"{listen}:{self.port}",
            "--state-dir",
            str(state_dir),
            "--hostname",
            "test-host",
            "--sample-interval",
            "0.2",
            "--heartbeat-interval",
            "0.5",
            "--ssh-listen",
            f"{listen}:{self.ssh_port}",
            *args,
        ]
        if secret:
            cmd += ["--secret", secret]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "GPUCLOUD_TEST_AGENT_ONLY": "the agent's, not the workload's"},
            )
        self.client = self.client_with(secret)

    def client_with(self, secret: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=15)

    def log(self) -> str:
        return self.log_path.read_text()

    # An oci agent asks its engine about the host and tries a throwaway container first:
    # many seconds on a 2-core machine busy with other tests' containers.
    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/v1/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"agent not ready after {timeout} s:\n{self.log()}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL, as a crash would; the workloads it started live on."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def terminate(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(15)

    def allocation(self, alloc_id: str) -> dict:
        listed = self.client.get("/v1/allocations").json()["allocations"]
        return next(a for a in listed if a["id"] == alloc_id)

    def wait_state(self, alloc_id: str, state: str, timeout: float = 10.0) -> dict:
        return wait_for(
            lambda: (a := self.allocation(alloc_id))["state"] == state and a, timeout=timeout
        )

    def reap_workloads(self) -> None:
        """Kill the workloads its state still records (the agent may be dead)."""
        path = self.state_dir / "allocations.json"
        if not path.exists():
            return
        for record in json.loads(path.read_text()):
            pid = record["pid"]
            if pid and start_time(pid) == record["pid_start"]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
