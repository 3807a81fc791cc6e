"""`gpucloud snapshots …` and `gpucloud shelve` against the live API (the agents' side is the
end-to-end tests')."""

import json

import pytest
from django.utils import timezone

from console.fleet.models import Host
from console.snapshots.models import Shelf, Snapshot
from console.volumes.models import Volume

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cli(member_cli, keeper):
    return member_cli


def test_take_list_schedule_delete_and_shelve(cli):
    code, out, err = cli("snapshots", "take", "keeper")
    assert code == 0, err
    assert "keeper" in out and "running" in out
    taken = Snapshot.objects.get()
    Snapshot.objects.filter(pk=taken.pk).update(
        state="done", finished_at=timezone.now(), bytes_unique=3 * 1024**2, bytes_shared=1024**3
    )
    code, out, _ = cli("snapshots", "list")
    assert "3.0 MiB unique, 1024.0 MiB shared" in out and "done" in out
    code, out, _ = cli("--json", "snapshots", "schedule", "keeper", "--every-hours", "6",
                       "--keep", "4")  # fmt: skip
    assert code == 0 and json.loads(out)["keep"] == 4
    assert "6" in cli("snapshots", "schedules")[1]
    code, _, err = cli("snapshots", "schedule", "keeper", "--every-hours", "0", "--keep", "4")
    assert code == 1 and "every_hours" in err
    code, out, _ = cli("snapshots", "delete", str(taken.pk), "--yes")
    assert code == 0 and f"Deleted snapshot {taken.pk}" in out
    assert Snapshot.objects.get(pk=taken.pk).deleted_at is not None

    code, out, err = cli("shelve", "keeper")
    assert code == 0, err
    assert "Shelving instance" in out
    assert Shelf.objects.get().state == "shelving"
    code, _, err = cli("shelve", "keeper")
    assert code == 1 and "shelving already" in err


def test_a_volume_is_snapshotted_scheduled_and_restored(cli, tenant):
    host = Host.objects.get(name="h1")
    Volume.objects.create(tenant=tenant, name="data", size_gib=4, region=host.region, host=host)
    code, out, err = cli("snapshots", "take", "--volume", "data")
    assert code == 0, err
    assert "data" in out and "running" in out
    taken = Snapshot.objects.get()
    assert taken.volume.name == "data"
    with pytest.raises(SystemExit) as refused:
        cli("snapshots", "take", "keeper", "--volume", "data")
    assert refused.value.code == 2
    code, out, err = cli("--json", "snapshots", "schedule", "--volume", "data",
                         "--every-hours", "12", "--keep", "3")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["source_name"] == "volume data"
    Snapshot.objects.filter(pk=taken.pk).update(
        state="done", finished_at=timezone.now(), restic_id="ab" * 32
    )
    code, _, err = cli("snapshots", "restore", str(taken.pk), "--name", "copy", "--size-gib", "2")
    assert code == 1 and "size_gib" in err
    code, out, err = cli("snapshots", "restore", str(taken.pk), "--name", "copy", "--host", "h1")
    assert code == 0, err
    assert "copy" in out and "h1" in out
    assert Volume.objects.get(name="copy").size_gib == 4
    code, out, _ = cli("snapshots", "restores")
    assert code == 0 and "copy" in out
