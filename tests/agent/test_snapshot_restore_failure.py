"""A restore job that fails (restic stops halfway, or its disk cannot be made) removes the disk
it was filling, and never a disk made for another (agent/snapshots.py). restic is replaced by
a function here; tests/agent/test_snapshots.py runs the real one."""

import time
from pathlib import Path

import pytest

from agent.snapshots import Restic, ResticError, SnapshotJobs
from tests.agent.test_snapshots import FolderDisks

STORE = {"repository": "/nowhere", "password": "p"}


def restore_body(volume: str = "vol-9") -> dict:
    return {"kind": "restore", "store": STORE, "volume": volume, "snapshot": "ab" * 32,
            "instance": "volume-8", "tenant": "3", "size_gib": 1}  # fmt: skip


def ended(jobs: SnapshotJobs, job_id: str) -> dict:
    deadline = time.monotonic() + 10
    while (view := jobs.get(job_id).view())["state"] == "running":
        assert time.monotonic() < deadline, view
        time.sleep(0.01)
    return view


class StrictDisks(FolderDisks):
    """Like agent.volumes.Disks, a folder without a record is not this agent's to fill."""

    def ensure(self, name: str, instance: str, tenant: str, size_gib: int | None) -> Path:
        if self.record(name) is None and (self.root / name).exists():
            raise RuntimeError(f"volume_foreign: {name} was not made by this agent")
        return super().ensure(name, instance, tenant, size_gib)


@pytest.fixture
def disks(tmp_path):
    return StrictDisks(tmp_path / "disks")


@pytest.fixture
def halfway(monkeypatch):
    """restic writes part of the snapshot's files, then fails."""

    def restore(self, snapshot: str, target: Path, progress) -> dict:
        (target / "model.bin").write_bytes(b"x" * 4096)
        progress(4096, 8192, None)
        raise ResticError("Fatal: unable to load snapshot: connection reset")

    monkeypatch.setattr(Restic, "restore", restore)


def test_a_restore_failing_halfway_removes_its_disk(disks, halfway, tmp_path):
    jobs = SnapshotJobs(disks, tmp_path / "state")
    jobs.start("restore-1", restore_body())
    view = ended(jobs, "restore-1")
    assert view["state"] == "failed" and "connection reset" in view["error"]
    assert not (disks.root / "vol-9").exists()


def test_a_disk_that_cannot_be_made_is_removed_too(disks, monkeypatch, tmp_path):
    def ensure(name, instance, tenant, size_gib):
        FolderDisks.ensure(disks, name, instance, tenant, size_gib)
        raise RuntimeError("mkfs.ext4: No space left on device")

    monkeypatch.setattr(disks, "ensure", ensure)
    jobs = SnapshotJobs(disks, tmp_path / "state")
    jobs.start("restore-1", restore_body())
    assert ended(jobs, "restore-1")["state"] == "failed"
    assert not (disks.root / "vol-9").exists()


def test_a_disk_not_made_for_the_restore_stays(disks, halfway, tmp_path):
    theirs = disks.root / "vol-9"
    theirs.mkdir(parents=True)
    (theirs / "data.txt").write_text("someone's")
    jobs = SnapshotJobs(disks, tmp_path / "state")
    jobs.start("restore-1", restore_body())
    assert "volume_foreign" in ended(jobs, "restore-1")["error"]
    assert (theirs / "data.txt").read_text() == "someone's"
