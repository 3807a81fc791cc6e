"""Snapshots of volumes, their schedules, and restoring a snapshot into a new volume on any host
of its region: the API, the services, what the restore job is asked, the audit log, and the
refusals (bad input, another tenant, a viewer). The agents' side is the end-to-end tests'."""

from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.roles import Role
from console.audit.models import AuditEntry
from console.fleet.models import Host
from console.instances import services as instance_services
from console.instances.models import Instance, State
from console.snapshots import services, tasks
from console.snapshots.models import Restore, Schedule, Shelf, Snapshot
from console.volumes.models import Volume
from tests.instances.helpers import make_instance

URL = "/api/v1/snapshots/"
SCHEDULES = "/api/v1/snapshot-schedules/"


@pytest.fixture(autouse=True)
def queued(monkeypatch):
    """The tasks the services queue after their commit, recorded instead of sent."""
    from console.volumes import services as volume_services

    sent = []

    def enqueue(name, *args, countdown=None):
        sent.append((name, *args))

    monkeypatch.setattr(services, "enqueue_on_commit", enqueue)
    monkeypatch.setattr(volume_services, "enqueue_on_commit", enqueue)
    return sent


@pytest.fixture
def client(member, token_client):
    return token_client(member)


@pytest.fixture
def host(catalog):
    return catalog.host("gpu-1", gpus=1)


@pytest.fixture
def other_host(catalog):
    return catalog.host("gpu-2", gpus=1)


@pytest.fixture
def volume(catalog, tenant, host):
    return Volume.objects.create(
        tenant=tenant, name="data", size_gib=5, region=catalog.region, host=host
    )


def done(snapshot: Snapshot) -> Snapshot:
    Snapshot.objects.filter(pk=snapshot.pk).update(
        state="done", finished_at=timezone.now(), restic_id="ab" * 32, bytes_stored=1024**2
    )
    snapshot.refresh_from_db()
    return snapshot


def actions() -> list[str]:
    return list(AuditEntry.objects.order_by("pk").values_list("action", flat=True))


def test_a_volume_is_snapshotted_by_name_on_its_host(client, volume, host, queued):
    made = client.post(URL, {"volume": "data"}, format="json")
    assert made.status_code == 202, made.content
    shown = made.json()
    assert (shown["volume"], shown["instance"], shown["source_name"]) == (volume.pk, None, "data")
    assert shown["size_gib"] == 5 and shown["state"] == "running"
    snapshot = Snapshot.objects.get(pk=shown["id"])
    assert (snapshot.host_id, snapshot.disk_name) == (host.pk, volume.disk_name)
    assert snapshot.price_per_gib_month == volume.region.snapshot_price_per_gib_month
    assert ("console.snapshots.tasks.follow", "snapshot", snapshot.pk) in queued
    body = tasks._backup(snapshot)[2]
    assert (body["kind"], body["volume"]) == ("backup", volume.disk_name)
    assert actions() == ["snapshot.take"]
    assert client.post(URL, {"volume": str(volume.pk)}, format="json").status_code == 202


@pytest.mark.parametrize(
    ("body", "fields"),
    [({}, {"instance", "volume"}), ({"instance": 1, "volume": "data"}, {"instance", "volume"}),
     ({"volume": "nope"}, {"volume"}), ({"volume": ""}, {"volume"})],
)  # fmt: skip
def test_bad_sources_are_field_errors(client, volume, body, fields):
    answer = client.post(URL, body, format="json")
    assert answer.status_code == 400, answer.content
    assert fields <= set(answer.json()["errors"])
    assert not Snapshot.objects.exists()


def test_a_volume_without_a_disk_has_nothing_to_snapshot(client, catalog, tenant):
    Volume.objects.create(tenant=tenant, name="fresh", size_gib=5, region=catalog.region)
    answer = client.post(URL, {"volume": "fresh"}, format="json")
    assert answer.status_code == 409 and "no disk yet" in answer.json()["detail"]


def test_another_tenants_volume_and_snapshot_are_not_found(
    catalog, other_tenant, make_member, token_client, volume
):
    theirs = token_client(make_member(other_tenant, Role.MEMBER, username="eve"))
    answer = theirs.post(URL, {"volume": str(volume.pk)}, format="json")
    assert answer.status_code == 400 and "volume" in answer.json()["errors"]
    snapshot = done(services.take_volume_snapshot(volume))
    assert theirs.get(f"{URL}{snapshot.pk}/").status_code == 404
    restored = theirs.post(f"{URL}{snapshot.pk}/restore/", {"name": "loot"}, format="json")
    assert restored.status_code == 404
    schedule = theirs.post(SCHEDULES, {"volume": "data", "every_hours": 1, "keep": 1})
    assert schedule.status_code == 400 and "volume" in schedule.json()["errors"]
    assert not Volume.objects.filter(name="loot").exists()


def test_a_viewer_reads_but_changes_nothing(tenant, make_member, token_client, volume):
    viewer = token_client(make_member(tenant, Role.VIEWER, username="vic"))
    snapshot = done(services.take_volume_snapshot(volume))
    assert viewer.get(URL).status_code == 200
    assert viewer.post(URL, {"volume": "data"}, format="json").status_code == 403
    answer = viewer.post(f"{URL}{snapshot.pk}/restore/", {"name": "copy"}, format="json")
    assert answer.status_code == 403
    assert viewer.get("/api/v1/snapshot-restores/").status_code == 200
    assert Snapshot.objects.count() == 1 and not Restore.objects.exists()


def test_restore_into_a_new_volume_on_a_chosen_host(client, volume, other_host, queued):
    snapshot = done(services.take_volume_snapshot(volume))
    answer = client.post(
        f"{URL}{snapshot.pk}/restore/",
        {"name": "copy", "size_gib": 8, "host": "gpu-2"},
        format="json",
    )
    assert answer.status_code == 202, answer.content
    shown = answer.json()
    restore = Restore.objects.get(pk=shown["id"])
    new = Volume.objects.get(name="copy")
    assert (shown["volume"], shown["volume_name"], shown["host"]) == (new.pk, "copy", "gpu-2")
    assert (new.size_gib, new.host_id, new.state) == (8, other_host.pk, "available")
    assert (restore.disk_name, restore.instance_id) == (new.disk_name, None)
    assert ("console.snapshots.tasks.follow", "restore", restore.pk) in queued
    body = tasks._restore(Restore.objects.select_related("volume", "snapshot").get(pk=restore.pk))
    assert body[0] == other_host and body[1] == f"restore-{restore.pk}"
    assert {k: body[2][k] for k in ("kind", "volume", "snapshot", "instance", "size_gib")} == {
        "kind": "restore", "volume": new.disk_name, "snapshot": "ab" * 32,
        "instance": f"volume-{new.pk}", "size_gib": 8,
    }  # fmt: skip
    assert body[2]["tenant"] == str(new.tenant_id)
    listed = client.get("/api/v1/snapshot-restores/").json()["results"]
    assert [(r["id"], r["state"], r["percent"]) for r in listed] == [(restore.pk, "running", 0)]
    assert actions() == ["snapshot.take", "volume.create", "snapshot.restore"]
    refused = client.delete(f"{URL}{snapshot.pk}/")
    assert refused.status_code == 409 and refused.json()["code"] == "snapshot_restoring"


def test_restore_defaults_to_the_snapshots_host_and_size(client, volume, host):
    snapshot = done(services.take_volume_snapshot(volume))
    answer = client.post(f"{URL}{snapshot.pk}/restore/", {"name": "copy"}, format="json")
    assert answer.status_code == 202, answer.content
    new = Volume.objects.get(name="copy")
    assert (new.size_gib, new.host_id) == (5, host.pk)


@pytest.mark.parametrize(
    ("body", "field"),
    [({"name": "copy", "size_gib": 4}, "size_gib"), ({"name": "data"}, "name"),
     ({"name": "Bad Name"}, "name"), ({}, "name"), ({"name": "copy", "host": "nowhere"}, "host"),
     ({"name": "copy", "size_gib": "big"}, "size_gib")],
)  # fmt: skip
def test_restore_bad_input_is_a_field_error(client, volume, body, field):
    snapshot = done(services.take_volume_snapshot(volume))
    answer = client.post(f"{URL}{snapshot.pk}/restore/", body, format="json")
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["errors"]
    assert not Restore.objects.exists() and Volume.objects.count() == 1


def test_a_running_or_deleted_snapshot_is_not_restored(client, volume):
    snapshot = services.take_volume_snapshot(volume)
    answer = client.post(f"{URL}{snapshot.pk}/restore/", {"name": "copy"}, format="json")
    assert answer.status_code == 409 and "not done" in answer.json()["detail"]
    services.delete_snapshot(done(snapshot))
    answer = client.post(f"{URL}{snapshot.pk}/restore/", {"name": "copy"}, format="json")
    assert answer.status_code == 404
    assert not Volume.objects.filter(name="copy").exists()


def test_an_instance_waits_for_its_restored_volume(catalog, tenant, volume, other_host, queued):
    snapshot = done(services.take_volume_snapshot(volume))
    restore = services.restore_to_volume(snapshot, name="copy", host="gpu-2")
    waiting = make_instance(catalog, tenant, state=State.STARTING, name="reader")
    Volume.objects.filter(pk=restore.volume_id).update(instance=waiting, state="attached")
    assert services.hold_for_restore(waiting.pk, other_host) is True
    services.restore_done(restore.pk, {"bytes_total": 1234})
    services.restore_done(restore.pk, {"bytes_total": 1234})  # twice: once
    assert Restore.objects.get(pk=restore.pk).state == "done"
    provisions = [t for t in queued if t[0] == "console.instances.tasks.provision"]
    assert provisions == [("console.instances.tasks.provision", waiting.pk)]
    assert services.hold_for_restore(waiting.pk, other_host) is False


def test_a_failed_restore_deletes_its_unattached_volume(volume, queued):
    snapshot = done(services.take_volume_snapshot(volume))
    restore = services.restore_to_volume(snapshot, name="copy")
    services.restore_failed(restore.pk, "restic: no space left")
    services.restore_failed(restore.pk, "restic: no space left")
    new = Volume.objects.get(pk=restore.volume_id)
    assert new.deleted_at is not None and new.state == "deleted"
    assert Restore.objects.get(pk=restore.pk).error == "restic: no space left"
    assert ("console.volumes.tasks.remove_disk", new.pk) in queued


def test_a_volume_schedule_is_set_changed_run_pruned_and_removed(client, volume, queued):
    made = client.post(SCHEDULES, {"volume": "data", "every_hours": 6, "keep": 2})
    assert made.status_code == 201, made.content
    shown = made.json()
    assert (shown["volume"], shown["instance"], shown["source_name"]) == (
        volume.pk, None, "volume data",
    )  # fmt: skip
    again = client.post(SCHEDULES, {"volume": str(volume.pk), "every_hours": 2, "keep": 2})
    assert again.status_code == 201 and again.json()["id"] == shown["id"]
    client.post(SCHEDULES, {"volume": "data", "every_hours": 2, "keep": 2})  # no change
    schedule = Schedule.objects.get()
    start = timezone.now()
    taken = []
    for hours in (0, 1, 2, 4):
        snapshot = services.run_schedule(schedule.pk, now=start + timedelta(hours=hours))
        if snapshot is not None:
            assert (snapshot.volume_id, snapshot.kind) == (volume.pk, "scheduled")
            services.snapshot_done(snapshot.pk, {"result": {"snapshot": "cd" * 32}})
            services.prune_schedule(schedule.pk)
            taken.append(snapshot.pk)
    assert len(taken) == 3
    kept = Snapshot.objects.filter(deleted_at__isnull=True).order_by("pk")
    assert list(kept.values_list("pk", flat=True)) == taken[1:]
    listed = client.get(SCHEDULES).json()["results"]
    assert [s["id"] for s in listed] == [schedule.pk]
    assert client.delete(f"{SCHEDULES}{schedule.pk}/").status_code == 204
    assert not Schedule.objects.exists()
    assert [a for a in actions() if a.startswith("schedule.")] == [
        "schedule.create", "schedule.change", "schedule.delete",
    ]  # fmt: skip


def test_delete_and_shelve_are_audited(client, catalog, tenant, host, volume):
    snapshot = done(services.take_volume_snapshot(volume))
    assert client.delete(f"{URL}{snapshot.pk}/").status_code == 204
    entry = AuditEntry.objects.get(action="snapshot.delete")
    assert entry.before["deleted_at"] is None and entry.after["deleted_at"]
    stopped = make_instance(catalog, tenant, state=State.STOPPED, name="keeper", disk_host=host)
    assert client.post(f"/api/v1/instances/{stopped.pk}/shelve/").status_code == 202
    shelved = AuditEntry.objects.get(action="instance.shelve")
    assert shelved.after["shelf"] == "shelving" and shelved.object_id == str(stopped.pk)


@pytest.fixture
def shelvable(catalog, tenant, host, volume):
    """A stopped instance on gpu-1 with the volume `data` attached."""
    stopped = make_instance(catalog, tenant, state=State.STOPPED, name="keeper", disk_host=host)
    Volume.objects.filter(pk=volume.pk).update(
        instance=stopped, state="attached", mount_path="/data"
    )
    return stopped


def _finish(snapshots) -> None:
    for snapshot in snapshots:
        services.snapshot_done(snapshot.pk, {"result": {"snapshot": "ef" * 32, "bytes_added": 9}})


def test_shelving_takes_its_volumes_along_and_unshelving_brings_them_back(
    client, shelvable, volume, host, other_host, queued
):
    answer = client.post(f"/api/v1/instances/{shelvable.pk}/shelve/")
    assert answer.status_code == 202, answer.content
    disk, of_volume = Snapshot.objects.filter(shelf__instance=shelvable).order_by("pk")
    assert (disk.volume_id, of_volume.volume_id, of_volume.kind) == (None, volume.pk, "shelve")
    _finish([disk])  # the volume's is still running: not shelved yet
    assert shelvable.shelf.state == "shelving"
    _finish([of_volume])
    shelvable.shelf.refresh_from_db()
    assert shelvable.shelf.state == "shelved"
    assert Volume.objects.get(pk=volume.pk).host_id is None
    assert ("console.snapshots.tasks.remove_volume_disk", volume.pk, host.pk) in queued
    detach = client.post(f"/api/v1/volumes/{volume.pk}/detach/")
    assert detach.status_code == 409 and detach.json()["code"] == "instance_shelved"

    # placed on gpu-2: the disk and the volume are restored there before it starts
    assert services.hold_for_restore(shelvable.pk, other_host) is True
    restores = list(Restore.objects.filter(shelf__instance=shelvable).order_by("pk"))
    assert [(r.instance_id, r.volume_id, r.snapshot_id) for r in restores] == [
        (shelvable.pk, None, disk.pk), (None, volume.pk, of_volume.pk),
    ]  # fmt: skip
    assert Volume.objects.get(pk=volume.pk).host_id == other_host.pk
    body = tasks._restore(
        Restore.objects.select_related("volume", "snapshot").get(pk=restores[1].pk)
    )
    assert (body[2]["instance"], body[2]["volume"]) == (f"volume-{volume.pk}", volume.disk_name)
    services.restore_done(restores[1].pk, {"bytes_total": 5})
    assert Restore.objects.filter(shelf__instance=shelvable).count() == 2  # the disk's runs
    services.restore_done(restores[0].pk, {"bytes_total": 5})
    assert not Shelf.objects.exists()
    assert ("console.instances.tasks.provision", shelvable.pk) in queued
    assert not Snapshot.objects.filter(deleted_at__isnull=True).exists()


def test_a_failed_volume_restore_keeps_the_instance_shelved(shelvable, volume, other_host, queued):
    services.shelve_instance(shelvable)
    _finish(Snapshot.objects.all())
    Instance.objects.filter(pk=shelvable.pk).update(state=State.STARTING)  # started meanwhile
    services.hold_for_restore(shelvable.pk, other_host)
    failing = Restore.objects.get(volume=volume)
    services.restore_failed(failing.pk, "restic: broken")
    shelvable.refresh_from_db()
    assert shelvable.state == "failed" and "volume data" in shelvable.state_reason
    assert shelvable.shelf.state == "shelved" and shelvable.shelf.host_id is None
    live = Volume.objects.get(pk=volume.pk)
    assert (live.deleted_at, live.host_id, live.instance_id) == (None, None, shelvable.pk)


def test_terminating_a_shelved_instance_keeps_its_volumes_data_in_snapshots(
    shelvable, volume, queued
):
    from console.instances import services as instance_services

    services.shelve_instance(shelvable)
    _finish(Snapshot.objects.all())
    instance_services.terminate_instance(shelvable)  # detaches its volumes
    assert Volume.objects.get(pk=volume.pk).instance_id is None
    # what instance_state_changed delivers after the commit, once it is terminated
    services.on_instance_terminated(
        None, instance=shelvable, from_state=State.TERMINATING, to_state=State.TERMINATED, at=None
    )
    gone = Volume.objects.get(pk=volume.pk)
    assert gone.deleted_at is not None and gone.instance_id is None
    [kept] = Snapshot.objects.filter(deleted_at__isnull=True)
    assert (kept.volume_id, kept.kind, kept.shelf_id) == (volume.pk, "on_demand", None)


def _unshelving(instance) -> tuple:
    """Start the shelved instance as a tenant would: it is placed (on any host of its region
    that fits) and its provisioning waits while its disk and volume are restored there."""
    instance_services.start_instance(instance)
    instance.refresh_from_db()
    placed = instance.current_allocation().host
    assert services.hold_for_restore(instance.pk, placed) is True
    disk, of_volume = Restore.objects.filter(host=placed, state="running").order_by("pk")
    return placed, disk, of_volume


def test_a_failed_unshelve_leaves_nothing_on_its_host_and_starts_again_anywhere(
    shelvable, volume, host, other_host, queued
):
    services.shelve_instance(shelvable)
    _finish(Snapshot.objects.all())
    taken = set(Snapshot.objects.values_list("pk", flat=True))
    placed, disk, of_volume = _unshelving(shelvable)
    del queued[:]
    services.restore_done(disk.pk, {"bytes_total": 5})  # its disk is there, whole
    services.restore_failed(of_volume.pk, "Fatal: unable to load snapshot: connection reset")

    shelvable.refresh_from_db()
    assert shelvable.state == "failed"
    assert shelvable.state_reason.startswith(f"Its volume data could not be restored on {placed}")
    assert "It stays shelved" in shelvable.events.order_by("-pk").first().message
    assert shelvable.shelf.state == "shelved" and shelvable.disk_host_id is None
    assert Volume.objects.get(pk=volume.pk).host_id is None
    shelf_snapshots = Snapshot.objects.filter(shelf=shelvable.shelf, deleted_at__isnull=True)
    assert set(shelf_snapshots.values_list("pk", flat=True)) == taken
    # the disk restored there and the volume's partial disk both leave that host
    assert ("console.snapshots.tasks.remove_disk", shelvable.pk, placed.pk) in queued
    assert ("console.snapshots.tasks.remove_volume_disk", volume.pk, placed.pk) in queued

    # a start tries again, from the same snapshots, wherever it fits: not pinned to that host
    Host.objects.filter(pk=placed.pk).update(status=Host.Status.CORDONED)
    again, disk, of_volume = _unshelving(shelvable)
    assert again != placed and shelvable.state == "starting"
    assert {disk.snapshot_id, of_volume.snapshot_id} == taken
    services.restore_done(disk.pk, {"bytes_total": 5})
    services.restore_done(of_volume.pk, {"bytes_total": 5})
    assert not Shelf.objects.filter(instance=shelvable).exists()
    assert ("console.instances.tasks.provision", shelvable.pk) in queued
    assert Volume.objects.get(pk=volume.pk).host_id == again.pk


def test_a_restore_still_running_when_its_unshelve_fails_is_removed_as_it_ends(
    shelvable, volume, queued
):
    services.shelve_instance(shelvable)
    _finish(Snapshot.objects.all())
    placed, disk, of_volume = _unshelving(shelvable)
    del queued[:]
    services.restore_failed(of_volume.pk, "restic: broken")
    assert ("console.snapshots.tasks.remove_disk", shelvable.pk, placed.pk) not in queued
    services.restore_done(disk.pk, {"bytes_total": 5})  # the disk's restore ends afterwards
    assert ("console.snapshots.tasks.remove_disk", shelvable.pk, placed.pk) in queued
    assert Shelf.objects.get(instance=shelvable).state == "shelved"
    assert ("console.instances.tasks.provision", shelvable.pk) not in queued


def test_a_disk_placed_on_that_host_again_is_not_removed(shelvable, host, monkeypatch):
    removed = []
    monkeypatch.setattr(
        tasks.agent_client, "delete_instance_data", lambda h, pk: removed.append((h.pk, pk))
    )
    tasks.remove_disk(shelvable.pk, host.pk)  # its disk is on gpu-1 again: it stays
    assert removed == []
    Instance.objects.filter(pk=shelvable.pk).update(disk_host=None)
    tasks.remove_disk(shelvable.pk, host.pk)
    assert removed == [(host.pk, shelvable.pk)]


def test_a_late_failure_of_a_given_up_unshelve_leaves_the_next_one_alone(
    shelvable, volume, other_host, queued
):
    services.shelve_instance(shelvable)
    _finish(Snapshot.objects.all())
    first, disk, of_volume = _unshelving(shelvable)
    services.restore_failed(of_volume.pk, "restic: broken")  # its disk's restore still runs
    Host.objects.filter(pk=first.pk).update(status=Host.Status.CORDONED)
    second, *_ = _unshelving(shelvable)
    del queued[:]
    services.restore_failed(disk.pk, "restic: broken too")  # the first one's, late
    shelvable.refresh_from_db()
    assert shelvable.state == "starting"
    assert (shelvable.shelf.state, shelvable.shelf.host) == ("unshelving", second)
    assert queued == [("console.snapshots.tasks.remove_disk", shelvable.pk, first.pk)]
