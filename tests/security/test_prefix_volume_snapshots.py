"""A token confined to an instance name prefix (`ci-`) and volumes' snapshots: a volume is the
token's when its name starts with the prefix, as an instance is. It lists, reads, takes,
schedules and deletes the snapshots of `ci-*` volumes; to it every other volume's snapshots,
schedules and restores do not exist (404, or "no volume" as for a name nobody has), and it can
neither change them nor attach another volume to its own instances at launch."""

import pytest
from django.utils import timezone

from accounts.roles import Role
from console.instances.models import Instance, State
from console.snapshots import services
from console.snapshots.models import Restore, Schedule, Snapshot
from console.volumes.models import Volume
from tests.instances.conftest import Catalog
from tests.instances.helpers import make_instance
from tests.security.test_token_scopes import client_of

URL = "/api/v1/snapshots/"
SCHEDULES = "/api/v1/snapshot-schedules/"
RESTORES = "/api/v1/snapshot-restores/"


@pytest.fixture
def catalog(db):
    return Catalog()


@pytest.fixture
def owner(tenant, make_member):
    return make_member(tenant, Role.OWNER)


def _done(snapshot: Snapshot) -> Snapshot:
    Snapshot.objects.filter(pk=snapshot.pk).update(
        state="done", finished_at=timezone.now(), restic_id="ab" * 32
    )
    return Snapshot.objects.get(pk=snapshot.pk)


@pytest.fixture
def world(catalog, tenant):
    """Volumes ci-cache and prod-data on gpu-1, each with a done snapshot, a schedule and a
    restore into a new volume; the stopped instance ci-1."""
    host = catalog.host("gpu-1", gpus=1)
    made = {"instance": make_instance(catalog, tenant, state=State.STOPPED, name="ci-1")}
    for name in ("ci-cache", "prod-data"):
        volume = Volume.objects.create(
            tenant=tenant, name=name, size_gib=1, region=catalog.region, host=host
        )
        snapshot = _done(services.take_volume_snapshot(volume))
        made[name] = {
            "volume": volume,
            "snapshot": snapshot,
            "schedule": services.set_schedule(volume, 6, 2),
            "restore": services.restore_to_volume(snapshot, name=f"{name}-copy"),
        }
    return made


@pytest.fixture
def confined(owner):
    return client_of(owner, scopes=["snapshots:*", "instances:*"], instance_prefix="ci-")


def ids(response) -> set[int]:
    assert response.status_code == 200, response.content
    return {row["id"] for row in response.json()["results"]}


def test_it_sees_only_the_snapshots_schedules_and_restores_of_its_volumes(confined, world):
    ours, theirs = world["ci-cache"], world["prod-data"]
    assert ids(confined.get(URL)) == {ours["snapshot"].pk}
    assert ids(confined.get(SCHEDULES)) == {ours["schedule"].pk}
    assert ids(confined.get(RESTORES)) == {ours["restore"].pk}
    assert confined.get(f"{URL}{ours['snapshot'].pk}/").status_code == 200
    assert confined.get(f"{SCHEDULES}{ours['schedule'].pk}/").status_code == 200
    assert confined.get(f"{RESTORES}{ours['restore'].pk}/").status_code == 200
    assert confined.get(f"{URL}{theirs['snapshot'].pk}/").status_code == 404
    assert confined.get(f"{SCHEDULES}{theirs['schedule'].pk}/").status_code == 404
    assert confined.get(f"{RESTORES}{theirs['restore'].pk}/").status_code == 404


def test_another_volume_is_not_found_and_nothing_of_it_changes(confined, world):
    theirs = world["prod-data"]
    assert confined.delete(f"{URL}{theirs['snapshot'].pk}/").status_code == 404
    assert confined.delete(f"{SCHEDULES}{theirs['schedule'].pk}/").status_code == 404
    nobody = confined.post(URL, {"volume": "no-such-volume"}, format="json").json()
    for ref in ("prod-data", str(theirs["volume"].pk)):
        taken = confined.post(URL, {"volume": ref}, format="json")
        assert taken.status_code == 400
        # the very answer a name that nobody has gets: nothing says it exists
        assert taken.json()["errors"]["volume"] == [f"You have no volume {ref}."]
        body = {"volume": ref, "every_hours": 1, "keep": 1}
        scheduled = confined.post(SCHEDULES, body, format="json")
        assert scheduled.status_code == 400 and "volume" in scheduled.json()["errors"]
    assert set(nobody["errors"]) == {"volume"}
    assert Snapshot.objects.filter(volume=theirs["volume"], deleted_at__isnull=True).count() == 1
    schedule = Schedule.objects.get(pk=theirs["schedule"].pk)
    assert (schedule.every_hours, schedule.keep) == (6, 2)


def test_it_acts_on_its_own_volumes_snapshots(confined, world):
    ours = world["ci-cache"]
    taken = confined.post(URL, {"volume": "ci-cache"}, format="json")
    assert taken.status_code == 202, taken.content
    assert taken.json()["volume"] == ours["volume"].pk
    body = {"volume": "ci-cache", "every_hours": 2, "keep": 3}
    assert confined.post(SCHEDULES, body, format="json").status_code == 201
    Restore.objects.filter(pk=ours["restore"].pk).update(state="done")  # deletable now
    assert confined.delete(f"{URL}{ours['snapshot'].pk}/").status_code == 204
    assert Snapshot.objects.get(pk=ours["snapshot"].pk).deleted_at is not None


def test_it_restores_and_attaches_no_volume(owner, world, catalog):
    """Restoring makes a volume and a launch's `volumes` attach them: both are volumes:write,
    which is never a prefix token's."""
    confined = client_of(owner, instance_prefix="ci-")  # every scope its role allows
    ours = world["ci-cache"]
    restored = confined.post(f"{URL}{ours['snapshot'].pk}/restore/", {"name": "ci-new"})
    assert restored.status_code == 403 and restored.json()["code"] == "prefix_confined"
    assert confined.get("/api/v1/volumes/").status_code == 403
    for ref in ("ci-cache", "prod-data"):
        body = {"name": "ci-2", "spec": "a100-quarter", "volumes": [{"volume": ref}]}
        launched = confined.post("/api/v1/instances/", body, format="json")
        assert launched.status_code == 400 and "volumes" in launched.json()["errors"]
    assert not Volume.objects.filter(name="ci-new").exists()
    assert not Instance.objects.filter(name="ci-2").exists()
    assert Volume.objects.filter(instance__isnull=False).count() == 0
    assert Restore.objects.count() == 2
