"""The clients the tests attack an instance's SSH gateway with: OpenSSH's ssh, scp and sftp,
asyncssh, and the operator's `podman exec` (the `gateway` fixture is in conftest.py)."""

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import asyncssh

OPENSSH = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
           "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]  # fmt: skip


@dataclass
class Gateway:
    agent: object
    port: int
    instance: str
    keys: dict  # name -> (asyncssh key, private key file)
    engine: object

    def options(self, key: str = "laptop") -> list[str]:
        return [*OPENSSH, "-i", str(self.keys[key][1])]

    @property
    def target(self) -> str:
        return f"{self.instance}@127.0.0.1"

    def ssh(self, command: str, key: str = "laptop", **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ssh", "-p", str(self.port), *self.options(key), self.target, command],
            capture_output=True, text=True, timeout=60, **kwargs,
        )  # fmt: skip

    def ssh_background(self, command: str, key: str = "laptop") -> subprocess.Popen:
        return subprocess.Popen(
            ["ssh", "-p", str(self.port), *self.options(key), self.target, command],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def scp(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["scp", "-P", str(self.port), *self.options(), *args],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    def sftp(self, *commands: str) -> subprocess.CompletedProcess:
        """OpenSSH's sftp running `commands` (each may fail: `-` before it, as in a batch)."""
        return subprocess.run(
            ["sftp", "-P", str(self.port), *self.options(), "-b", "-", self.target],
            input="".join(f"{c}\n" for c in commands), capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    def inside(self, command: str) -> subprocess.CompletedProcess:
        """A shell command in the container, run by the operator (`podman exec`)."""
        return self.engine.podman("exec", f"gpucloud-{self.instance}", "sh", "-c", command)

    def runs(self, marker: str) -> bool:
        """Whether a process of the container has `marker` in its command line (`ps` inside)."""
        listed = self.inside("ps -o args")
        assert listed.returncode == 0, listed.stderr
        return marker in listed.stdout

    def set_keys(self, *names: str, members: list[str] | None = None) -> None:
        """The console's push of the instance's access: these keys, and (if given) the members
        who may hold its terminals."""
        keys = [
            {"name": name, "public_key": self.keys[name][0].export_public_key().decode()}
            for name in names
        ]
        body = {"keys": keys} if members is None else {"keys": keys, "members": members}
        answer = self.agent.client.put(f"/v1/instances/{self.instance}/ssh-keys", json=body)
        assert answer.status_code == 200, answer.text

    async def connect(self, key: str = "laptop") -> asyncssh.SSHClientConnection:
        return await asyncssh.connect(
            "127.0.0.1", self.port, username=self.instance, client_keys=[self.keys[key][0]],
            known_hosts=None, agent_path=None,
        )  # fmt: skip


def until(check, seconds: float, what: str):
    """`check()`'s first true answer, asked every 0.2 s; AssertionError after `seconds`."""
    deadline = time.monotonic() + seconds
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(0.2)
    return result


def host_file(path: Path) -> str:
    """A host path as the tests send it after a link or prefix (without its leading /)."""
    return str(path).lstrip("/")
