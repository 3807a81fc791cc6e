"""A tenant's repository measured by the real restic after a backup, a second backup, a
forget with its prune (a schedule's) and a delete: the console records each measurement, equal
to what restic's own `stats --mode raw-data` says the repository holds, and each snapshot's
unique bytes are what deleting it frees. The jobs are the agent's (agent/snapshots.py) over a
plain folder disk, with the bodies the console's tasks send."""

import json
import os
import subprocess

import pytest

from agent.snapshots import RESTIC, SnapshotJobs
from console.snapshots import services, tasks
from console.snapshots import store as stores
from console.snapshots.models import Snapshot, StoreMeasurement
from tests.agent.test_snapshots import FolderDisks, wait

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_tasks")]

MIB = 1024**2


@pytest.fixture
def repository(tmp_path, settings):
    settings.SNAPSHOT_REPOSITORY = str(tmp_path / "restic")
    settings.SNAPSHOT_MASTER_SECRET = "store-measurement-master-secret-of-32-characters"
    return tmp_path


def restic_total(snapshot: Snapshot) -> int:
    """What restic itself says the snapshot's repository holds."""
    store = stores.for_snapshot(snapshot)
    env = {**os.environ, "RESTIC_REPOSITORY": store["repository"]}
    env["RESTIC_PASSWORD"] = store["password"]
    stats = subprocess.run(
        [RESTIC, "stats", "--json", "--mode", "raw-data", "--no-cache"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(json.loads(stats.stdout)["total_size"])


def test_every_backup_prune_and_delete_is_measured_as_restic_sees_it(repository, catalog, tenant):
    disks = FolderDisks(repository / "disks")
    mount = disks.ensure("vol-1", "7", str(tenant.pk), 1)
    jobs = SnapshotJobs(disks, repository / "state")

    def backup() -> Snapshot:
        snapshot = Snapshot.objects.create(
            tenant=tenant, region=catalog.region, source_name="trainer", disk_name="vol-1",
            size_gib=1,
        )  # fmt: skip
        _, job_id, body = tasks._backup(snapshot)
        assert body["measure"] is True
        jobs.start(job_id, body)
        view = wait(jobs, job_id)
        assert view["state"] == "done", view["error"]
        services.snapshot_done(snapshot.pk, view)
        return Snapshot.objects.get(pk=snapshot.pk)

    def forget(snapshot: Snapshot) -> None:
        _, job_id, body = tasks._forget(Snapshot.objects.get(pk=snapshot.pk))
        jobs.start(job_id, body)
        view = wait(jobs, job_id)
        assert view["state"] == "done", view["error"]
        services.forgotten(snapshot.pk, view)

    def measured() -> int:
        return StoreMeasurement.objects.filter(tenant=tenant).latest("measured_at", "pk").bytes

    (mount / "base.bin").write_bytes(os.urandom(8 * MIB))
    first = backup()
    assert measured() == restic_total(first) >= 8 * MIB
    assert (first.bytes_unique, first.bytes_shared) == (measured(), 0)  # alone: all its own

    (mount / "more.bin").write_bytes(os.urandom(4 * MIB))
    second = backup()
    assert measured() == restic_total(second) >= 12 * MIB
    (mount / "base.bin").unlink()
    third = backup()  # holds more.bin only: base.bin is the first two's
    assert measured() == restic_total(third)
    first, second = (Snapshot.objects.get(pk=s.pk) for s in (first, second))
    assert second.bytes_shared >= 8 * MIB  # base.bin with the first, more.bin with the third
    assert third.bytes_unique < MIB  # its trees only: its data is the second's too
    assert first.bytes_unique < MIB  # all of its data the second holds too

    # a schedule's prune of the first, then the tenant deletes the second: each frees the
    # unique bytes it showed, as measured just before
    before, freed = measured(), first.bytes_unique
    Snapshot.objects.filter(pk=first.pk).update(kind=Snapshot.Kind.SCHEDULED)
    services.delete_snapshot(first)
    forget(first)
    assert measured() == restic_total(third) == before - freed
    second = Snapshot.objects.get(pk=second.pk)
    assert second.bytes_unique >= 8 * MIB  # base.bin is now the second's alone

    before, freed = measured(), second.bytes_unique
    services.delete_snapshot(second)
    forget(second)
    assert measured() == restic_total(third) == before - freed
    third = Snapshot.objects.get(pk=third.pk)
    assert (third.bytes_unique, third.bytes_shared) == (measured(), 0)
    assert StoreMeasurement.objects.filter(tenant=tenant).count() == 5
