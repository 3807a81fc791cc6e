"""What the console and the agents keep on disk is their user's alone (issue 41): `make run`'s
state directory is 0700 and every file in it (secrets, logs, the database, beat's schedule,
the agents' identities, host keys, disks, logs and restic's cache) has no group or other bits,
while instances run and snapshot, and after Ctrl-C. A container engine may not open it up."""

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from console import processes
from tests.test_launcher import make_run_env, start_make_run, wait_for

ROOT = Path(__file__).resolve().parent.parent.parent

pytestmark = [pytest.mark.integration]


def assert_private(var: Path) -> None:
    opened = too_open(var)
    assert not opened, "\n".join(opened[:40])


def too_open(var: Path) -> list[str]:
    """Every path under `var` (itself included) with a group or other permission bit; a
    mounted file system (a tenant's disk) is the tenant's, and `static/` the console's public
    files (collectstatic's copies of what it serves anyone), neither walked."""
    found = []
    device = var.stat().st_dev
    for folder, dirs, files in os.walk(var):
        if Path(folder) == var:
            dirs[:] = [d for d in dirs if d != "static"]
        dirs[:] = [d for d in dirs if (Path(folder) / d).lstat().st_dev == device]
        for name in [".", *files, *dirs]:
            path = Path(folder) / name
            mode = path.lstat().st_mode
            if not stat.S_ISLNK(mode) and stat.S_IMODE(mode) & 0o077:
                found.append(f"{oct(stat.S_IMODE(mode))} {path.relative_to(var.parent)}")
    return sorted(set(found))


@pytest.mark.timeout(900)
def test_make_runs_state_is_private(tmp_path):
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
        token = subprocess.run(
            [sys.executable, "manage.py", "create_api_token", "alice", "--tenant", "acme"],
            cwd=ROOT, env=env, check=True, capture_output=True, text=True,
        ).stdout.split()[-1]  # fmt: skip
        api = httpx.Client(
            base_url=f"http://127.0.0.1:{port}/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        body = {"name": "private", "spec": "a100-quarter", "image": "demo-busybox"}
        pk = api.post("/instances/", json=body).json()["id"]
        wait_for(
            lambda: api.get(f"/instances/{pk}/").json()["state"] == "running",
            180, "the instance to run", log_path, launcher,
        )  # fmt: skip
        if "workloads: containers" in log_path.read_text():  # a disk to snapshot: restic's cache
            snapshot = api.post("/snapshots/", json={"instance": pk}).json()["id"]
            wait_for(
                lambda: api.get(f"/snapshots/{snapshot}/").json()["state"] == "done",
                180, "the snapshot", log_path, launcher,
            )  # fmt: skip
            assert list(var.glob("agents/*/restic-cache/*"))
        assert list(var.glob("agents/*/identity.json")) and list(var.glob("celerybeat-schedule*"))
        assert_private(var)

        os.killpg(launcher.pid, signal.SIGINT)
        assert launcher.wait(timeout=240) == 0, log_path.read_text()[-4000:]
    finally:
        if launcher.poll() is None:
            launcher.terminate()
            launcher.wait(timeout=120)
    names = {path.name for path in var.iterdir()}
    assert {"web.log", "worker.log", "beat.log", "secret-key", "snapshot-master-secret"} <= names
    assert {"ssh-ca-key", "agent-host-a.log", "gpucloud.sqlite3"} <= names
    assert_private(var)
