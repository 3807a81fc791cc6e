"""A tenant attacking another's snapshots, schedules and shelves through the API: nothing of
theirs is found, nothing of theirs changes."""

import pytest

from accounts.roles import Role
from console.instances.models import State
from console.snapshots import services
from console.snapshots.models import Schedule, Shelf, Snapshot
from console.volumes.models import Volume
from tests.instances.conftest import Catalog
from tests.instances.helpers import make_instance
from tests.snapshots.test_api import URL, done_snapshot


@pytest.fixture
def catalog(db):
    return Catalog()


@pytest.fixture
def client(tenant, make_member, token_client):
    return token_client(make_member(tenant, Role.MEMBER, username="mia"))


@pytest.fixture
def host(catalog):
    return catalog.host(gpus=1)


def test_another_tenants_snapshots_and_instances_are_not_found(client, catalog, other_tenant, host):
    theirs = make_instance(catalog, other_tenant, state=State.STOPPED, disk_host=host)
    snapshot = done_snapshot(theirs)
    assert client.get(f"{URL}{snapshot.pk}/").status_code == 404
    assert client.delete(f"{URL}{snapshot.pk}/").status_code == 404
    assert client.post(f"/api/v1/instances/{theirs.pk}/shelve/").status_code == 404
    assert client.get(URL).json()["results"] == []
    answer = client.post(URL, {"instance": theirs.pk}, format="json")
    assert answer.status_code == 400 and "instance" in answer.json()["errors"]
    schedule = {"instance": theirs.pk, "every_hours": 1, "keep": 1}
    assert client.post("/api/v1/snapshot-schedules/", schedule, format="json").status_code == 400
    assert Snapshot.objects.filter(instance=theirs).count() == 1
    assert not Shelf.objects.exists() and not Schedule.objects.exists()


def test_another_tenants_volumes_snapshots_restores_and_schedules_are_out_of_reach(
    client, catalog, other_tenant, host
):
    theirs = Volume.objects.create(
        tenant=other_tenant, name="secret", size_gib=1, region=catalog.region, host=host
    )
    snapshot = services.take_volume_snapshot(theirs)
    Snapshot.objects.filter(pk=snapshot.pk).update(state="done", restic_id="ab" * 32)
    restore = services.restore_to_volume(Snapshot.objects.get(pk=snapshot.pk), name="copy")
    schedule = services.set_schedule(theirs, 6, 2)
    for ref in (theirs.pk, "secret"):
        answer = client.post(URL, {"volume": str(ref)}, format="json")
        assert answer.status_code == 400 and "volume" in answer.json()["errors"]
        body = {"volume": str(ref), "every_hours": 1, "keep": 1}
        answer = client.post("/api/v1/snapshot-schedules/", body, format="json")
        assert answer.status_code == 400 and "volume" in answer.json()["errors"]
    restored = client.post(f"{URL}{snapshot.pk}/restore/", {"name": "loot"}, format="json")
    assert restored.status_code == 404
    assert client.get(f"/api/v1/snapshot-restores/{restore.pk}/").status_code == 404
    assert client.get("/api/v1/snapshot-restores/").json()["results"] == []
    assert client.get("/api/v1/snapshot-schedules/").json()["results"] == []
    assert client.delete(f"/api/v1/snapshot-schedules/{schedule.pk}/").status_code == 404
    assert Schedule.objects.filter(pk=schedule.pk).exists()
    assert not Volume.objects.filter(name="loot").exists()
    assert Snapshot.objects.filter(volume=theirs).count() == 1
