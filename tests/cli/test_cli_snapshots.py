"""`gpucloud snapshots …` and `gpucloud shelve` against the live API (the agents' side is the
end-to-end tests')."""

import json

import pytest
from django.utils import timezone

from accounts.roles import Role
from cli.main import main
from console.fleet.models import Host
from console.instances.models import Instance, State
from console.snapshots.models import Shelf, Snapshot
from console.volumes.models import Volume
from tests.factories import ImageFactory, RegionFactory, SpecFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cli(live_server, tenant, make_member, token_client, monkeypatch, tmp_path, capsys):
    region = RegionFactory()
    host = Host(name="h1", region=region, address="http://127.0.0.1:9")
    host.set_secret("secret-h1")
    host.save()
    Instance.objects.create(
        tenant=tenant, name="keeper", spec=SpecFactory(code="a100-quarter"),
        image=ImageFactory(), region=region, state=State.STOPPED, disk_host=host,
    )  # fmt: skip
    client = token_client(make_member(tenant, Role.MEMBER))
    monkeypatch.setenv("GPUCLOUD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("GPUCLOUD_URL", live_server.url)
    monkeypatch.setenv("GPUCLOUD_TOKEN", client.raw_token)

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_take_list_schedule_delete_and_shelve(cli):
    code, out, err = cli("snapshots", "take", "keeper")
    assert code == 0, err
    assert "keeper" in out and "running" in out
    taken = Snapshot.objects.get()
    Snapshot.objects.filter(pk=taken.pk).update(
        state="done", finished_at=timezone.now(), bytes_stored=3 * 1024 * 1024
    )
    code, out, _ = cli("snapshots", "list")
    assert "3.0 MiB" in out and "done" in out
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
