"""`make run` as a user runs it: its instance is reached with the ssh line the console gives
(through its SSH front); Ctrl-C stops its instances, then its processes, and leaves nothing
running (issue 26)."""

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import asyncssh
import httpx
import pytest

from agent.podman import podman_command, podman_env
from console import launcher, processes

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.integration]


def wait_for(check, timeout: float, what: str, log: Path, proc: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}\n{log.read_text()[-4000:]}")


def make_run_env(var: Path, port: int) -> dict[str, str]:
    """`make run`'s environment on a fresh machine: its own var/ and port, no DATABASE_URL or
    REDIS_URL (the embedded default), and no background build of the JupyterLab and PyTorch
    images (minutes of CPU no test but tests/browser/test_make_run_images.py needs)."""
    dropped = ("DATABASE_URL", "REDIS_URL", "GPUCLOUD_SQLITE_PATH", "PORTS_DOMAIN")
    return {
        **{k: v for k, v in os.environ.items() if k not in dropped},
        "GPUCLOUD_VAR_DIR": str(var),
        "PORT": str(port),
        # a port of its own for the SSH front: two make runs of the suite's workers would both
        # take 2222 when free, and the second one's front would find it taken
        "SSH_FRONT": f"127.0.0.1:{processes.free_port()}",
        "WEB_CONCURRENCY": "1",
        "WORKER_CONCURRENCY": "2",
        "GPUCLOUD_BUILD_IMAGES": "0",
    }


def start_make_run(env: dict[str, str], log) -> subprocess.Popen:
    """`make run`'s launcher, in a session of its own as a terminal's foreground job (Ctrl-C
    signals the whole group), writing to `log`."""
    return subprocess.Popen(
        [sys.executable, "-m", "console.launcher"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def processes_mentioning(text: str) -> list[str]:
    """The command lines of the running processes that mention `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline:
                found.append(cmdline)
    return found


def podman(var: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        podman_command(launcher.podman_storage(var), *args),
        env=podman_env(),
        capture_output=True,
        text=True,
    )


def _ssh_through_the_front(api, pk, key, tmp_path, log_path, launcher) -> None:
    ssh = api.get(f"/instances/{pk}/").json()["ssh"]
    assert ssh["command"] == f"ssh -J {ssh['proxy_jump']} {pk}@gpucloud", ssh
    private, known_hosts, config = (tmp_path / name for name in ("key", "known_hosts", "config"))
    private.write_bytes(key.export_private_key())
    private.chmod(0o600)
    known_hosts.write_text("".join(f"{line}\n" for line in ssh["known_hosts"]))
    config.write_text(
        f"Host *\n  IdentityFile {private}\n  IdentitiesOnly yes\n  UserKnownHostsFile "
        f"{known_hosts}\n  StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n"
    )
    line = ["ssh", "-F", str(config), *shlex.split(ssh["command"])[1:], "echo inside"]

    def logged_in() -> bool:  # once the host's gateway holds its certificate
        return subprocess.run(line, capture_output=True, text=True, timeout=30).stdout == "inside\n"

    wait_for(logged_in, 60, "ssh through the front", log_path, launcher)


@pytest.mark.timeout(900)
def test_ctrl_c_of_make_run_stops_the_instances_and_leaves_nothing_running(tmp_path):
    var = tmp_path / "var"
    port = processes.free_port()
    env = make_run_env(var, port)
    log_path = tmp_path / "make-run.log"
    with log_path.open("wb") as log:
        launcher = start_make_run(env, log)
    try:
        wait_for(
            lambda: "Press Ctrl-C" in log_path.read_text(), 600, "make run", log_path, launcher
        )
        containers = "workloads: containers" in log_path.read_text()
        token = subprocess.run(
            [sys.executable, "manage.py", "create_api_token", "alice", "--tenant", "acme"],
            cwd=ROOT, env=env, check=True, capture_output=True, text=True,
        ).stdout.split()[-1]  # fmt: skip
        api = httpx.Client(
            base_url=f"http://127.0.0.1:{port}/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        key = asyncssh.generate_private_key("ssh-ed25519")
        public = key.export_public_key().decode()
        assert api.post("/ssh-keys/", json={"name": "t", "public_key": public}).status_code == 201
        answer = api.post(
            "/instances/", json={"name": "ctrl-c", "spec": "a100-quarter", "image": "demo-busybox"}
        )
        assert answer.status_code == 202, answer.text
        pk = answer.json()["id"]
        wait_for(
            lambda: api.get(f"/instances/{pk}/").json()["state"] == "running",
            180,
            "the instance to run",
            log_path,
            launcher,
        )
        container_id = None
        if containers:  # its ssh line goes through make run's SSH front, OpenSSH checking both hops
            _ssh_through_the_front(api, pk, key, tmp_path, log_path, launcher)
            inspected = json.loads(podman(var, "inspect", f"gpucloud-{pk}").stdout)[0]
            assert any(str(var) in m["Source"] for m in inspected["Mounts"])  # this run's
            container_id = inspected["Id"]
            assert processes_mentioning(container_id)  # its conmon
            assert str(var) in Path("/proc/self/mounts").read_text()  # its disk

        os.killpg(launcher.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        assert launcher.wait(timeout=240) == 0, log_path.read_text()[-4000:]
    finally:
        if launcher.poll() is None:
            launcher.terminate()  # stops what it started
            launcher.wait(timeout=120)

    output = log_path.read_text()
    assert "1 instance(s) stopped" in output, output[-4000:]
    assert processes_mentioning(str(var)) == []  # no agent, worker, beat or web left
    assert str(var) not in Path("/proc/self/mounts").read_text()  # no disk left mounted
    if container_id:
        assert podman(var, "container", "exists", container_id).returncode == 1
        assert processes_mentioning(container_id) == []  # no conmon left
    database = sqlite3.connect(var / "gpucloud.sqlite3")
    state = database.execute("SELECT state FROM instances_instance WHERE id = ?", (pk,)).fetchone()
    assert state == ("stopped",)
    segments = database.execute(
        "SELECT kind, ended_at IS NOT NULL FROM billing_usagesegment WHERE instance_id = ?",
        (pk,),
    ).fetchall()
    assert ("gpu", 1) in segments  # its GPU time is closed
    assert output.index("Stopping the instances") < output.index("Stopping the processes")
