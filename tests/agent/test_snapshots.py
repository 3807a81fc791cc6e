"""Snapshot jobs (agent/snapshots.py) with the real restic, over disks that are plain folders
(the mounted file systems of agent/volumes.py are the container tests')."""

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from agent.errors import ApiError
from agent.snapshots import SnapshotJobs

pytestmark = pytest.mark.integration

PASSWORD = "not-for-tenants-eyes"


class FolderDisks:
    """agent.volumes.Disks' calls that snapshot jobs make, on plain folders."""

    def __init__(self, root: Path):
        self.root = root

    def record(self, name: str) -> dict | None:
        try:
            return json.loads((self.root / name / "disk.json").read_text())
        except FileNotFoundError:
            return None

    def ensure(self, name: str, instance: str, tenant: str, size_gib: int | None) -> Path:
        folder = self.root / name
        (folder / "mnt").mkdir(parents=True, exist_ok=True)
        record = {"instance": instance, "tenant": tenant, "size_gib": size_gib or 10}
        (folder / "disk.json").write_text(json.dumps(record))
        return folder / "mnt"

    def delete_owned(self, name: str, owner: str, tenant: str) -> None:
        record = self.record(name)
        if record is not None and (record["instance"], record["tenant"]) == (owner, tenant):
            shutil.rmtree(self.root / name)


def digest(root: Path) -> str:
    """sha256 over the relative paths and bytes of every file under root."""
    total = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        total.update(str(path.relative_to(root)).encode())
        total.update(path.read_bytes())
    return total.hexdigest()


def wait(jobs: SnapshotJobs, job_id: str, seen: list | None = None) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view = jobs.get(job_id).view()
        if seen is not None:
            seen.append(view)
        if view["state"] != "running":
            return view
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still running: {view}")


@pytest.fixture
def setup(tmp_path):
    disks = FolderDisks(tmp_path / "disks")
    mount = disks.ensure("vol-1", "7", "acme", 1)
    (mount / "data").mkdir()
    (mount / "data" / "random.bin").write_bytes(os.urandom(8 * 1024 * 1024))
    (mount / "notes.txt").write_text("hello\n")
    store = {"repository": str(tmp_path / "repo"), "password": PASSWORD}
    return disks, SnapshotJobs(disks, tmp_path / "state"), store, mount


def test_a_backup_restores_the_same_bytes_into_a_new_volume(setup):
    disks, jobs, store, mount = setup
    body = {"kind": "backup", "store": store, "volume": "vol-1", "tags": ["volume=1"]}
    created, _ = jobs.start("snap-1", body)
    assert created
    seen: list = []
    backup = wait(jobs, "snap-1", seen)
    assert backup["state"] == "done", backup["error"]
    assert backup["bytes_done"] == backup["bytes_total"] == backup["result"]["bytes_total"]
    assert backup["result"]["bytes_total"] >= 8 * 1024 * 1024
    assert backup["result"]["bytes_added"] > 0
    assert len(backup["result"]["snapshot"]) == 64
    assert PASSWORD not in json.dumps(seen)

    # the same id and body: the job as it stands; another body: refused
    assert jobs.start("snap-1", body) == (False, jobs.get("snap-1"))
    with pytest.raises(ApiError) as refused:
        jobs.start("snap-1", {**body, "volume": "vol-2"})
    assert refused.value.status == 409

    restore = {
        "kind": "restore",
        "store": store,
        "volume": "vol-9",
        "snapshot": backup["result"]["snapshot"],
        "instance": "8",
        "tenant": "acme",
        "size_gib": 1,
    }
    jobs.start("restore-1", restore)
    restored = wait(jobs, "restore-1")
    assert restored["state"] == "done", restored["error"]
    assert restored["bytes_done"] == restored["bytes_total"] > 0
    assert digest(disks.root / "vol-9" / "mnt") == digest(mount)
    assert disks.record("vol-9") == {"instance": "8", "tenant": "acme", "size_gib": 1}

    jobs.start(
        "forget-1", {"kind": "forget", "store": store, "snapshots": [backup["result"]["snapshot"]]}
    )
    forgotten = wait(jobs, "forget-1")
    assert forgotten["result"] == {"forgotten": [backup["result"]["snapshot"]]}
    # forgetting it again (a retried job) forgets nothing, and is no failure
    jobs.start(
        "forget-2", {"kind": "forget", "store": store, "snapshots": [backup["result"]["snapshot"]]}
    )
    assert wait(jobs, "forget-2")["result"] == {"forgotten": []}


def test_a_failed_restore_leaves_no_disk(setup):
    """restic refuses the restore (no such snapshot in the store): the disk the job made for
    it is removed again."""
    disks, jobs, store, _ = setup
    jobs.start("snap-1", {"kind": "backup", "store": store, "volume": "vol-1"})
    assert wait(jobs, "snap-1")["state"] == "done"
    restore = {"kind": "restore", "store": store, "volume": "vol-9", "snapshot": "ab" * 32,
               "instance": "8", "tenant": "acme", "size_gib": 1}  # fmt: skip
    jobs.start("restore-1", restore)
    failed = wait(jobs, "restore-1")
    assert failed["state"] == "failed" and failed["error"]
    assert disks.record("vol-9") is None and not (disks.root / "vol-9").exists()
    assert disks.record("vol-1") is not None  # the snapshotted volume is untouched


def test_a_wrong_password_fails_the_job_without_showing_it(setup):
    _, jobs, store, _ = setup
    jobs.start("snap-1", {"kind": "backup", "store": store, "volume": "vol-1"})
    assert wait(jobs, "snap-1")["state"] == "done"
    wrong = {**store, "password": "guessed-password"}
    jobs.start("snap-2", {"kind": "backup", "store": wrong, "volume": "vol-1"})
    failed = wait(jobs, "snap-2")
    assert failed["state"] == "failed"
    assert "guessed-password" not in json.dumps(failed)


def test_a_finished_job_keeps_no_password_and_knows_its_body(setup):
    """The agent keeps finished jobs for the console to read: their store's password is not
    among what it keeps, yet the same id sent again with another body is still refused."""
    _, jobs, store, _ = setup
    body = {"kind": "backup", "store": store, "volume": "vol-1"}
    jobs.start("snap-1", body)
    assert wait(jobs, "snap-1")["state"] == "done"
    assert PASSWORD not in repr(vars(jobs.get("snap-1")))
    assert jobs.start("snap-1", dict(body))[0] is False
    with pytest.raises(ApiError) as refused:
        jobs.start("snap-1", {**body, "store": {**store, "password": "another"}})
    assert (refused.value.status, refused.value.code) == (409, "job_conflict")


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"kind": "copy"}, 400),
        ({"kind": "backup", "volume": "vol-1"}, 400),
        ({"kind": "backup", "store": {"repository": "r"}, "volume": "vol-1"}, 400),
        ({"kind": "backup", "store": {"repository": "r", "password": "p"}, "volume": "../x"}, 400),
        ({"kind": "restore", "store": {"repository": "r", "password": "p"}, "volume": "v",
          "snapshot": "nothex", "instance": "1", "tenant": "t", "size_gib": 1}, 400),
        ({"kind": "forget", "store": {"repository": "r", "password": "p"}, "snapshots": []}, 400),
        ({"kind": "backup", "store": {"repository": "r", "password": "p"}, "volume": "nope"}, 404),
        ({"kind": "restore", "store": {"repository": "r", "password": "p"}, "volume": "vol-1",
          "snapshot": "abcdef12", "instance": "99", "tenant": "t", "size_gib": 1}, 409),
    ],
)  # fmt: skip
def test_bad_jobs_are_refused(setup, body, status):
    _, jobs, _, _ = setup
    with pytest.raises(ApiError) as refused:
        jobs.start("bad-1", body)
    assert refused.value.status == status
    with pytest.raises(ApiError):
        jobs.get("bad-1")


def test_a_host_without_disks_refuses_backups(tmp_path):
    jobs = SnapshotJobs(None, tmp_path / "state")
    body = {"kind": "backup", "store": {"repository": "r", "password": "p"}, "volume": "v"}
    with pytest.raises(ApiError) as refused:
        jobs.start("snap-1", body)
    assert (refused.value.status, refused.value.code) == (409, "no_disks")


def test_measure_must_be_true_or_false(tmp_path):
    jobs = SnapshotJobs(FolderDisks(tmp_path), tmp_path / "state")
    store = {"repository": str(tmp_path / "repo"), "password": PASSWORD}
    body = {"kind": "forget", "store": store, "snapshots": ["ab" * 32], "measure": "yes"}
    with pytest.raises(ApiError) as refused:
        jobs.start("forget-1", body)
    assert (refused.value.status, refused.value.detail) == (400, "measure must be true or false")
