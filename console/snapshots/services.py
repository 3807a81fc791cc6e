"""Every change to snapshots, restores, schedules and shelves: one function each, in one
transaction with its audit entry, its agent work queued after the commit (tasks.follow polls a
job on a host agent until it ends, and records its outcome here).

A snapshot is of an instance's own disk or of a volume; a volume's snapshot is restored into a
new volume, on any host of its region, made by console.volumes.services.create_volume."""

import logging

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from console.audit import recorder as audit
from console.celery import enqueue_on_commit
from console.errors import DomainError, ErrorCode
from console.fleet.models import Host
from console.instances import lifecycle, locks, outcomes
from console.instances.models import Instance, State
from console.instances.reasons import Reason
from console.notices import notice
from console.snapshots import locks as snapshot_locks
from console.snapshots.models import Restore, Schedule, Shelf, Snapshot, StoreMeasurement
from console.volumes import locks as volume_locks
from console.volumes import services as volumes
from console.volumes.models import Volume

log = logging.getLogger(__name__)

S = State
RUNNING, DONE, FAILED = Snapshot.State.RUNNING, Snapshot.State.DONE, Snapshot.State.FAILED
SHELVABLE = (S.STOPPED, S.FAILED)
MAX_KEEP = 100
MAX_EVERY_HOURS = 24 * 30
AGENT_DISK_GIB = 10  # the size of a disk its instance did not size (agent/volumes.py)


class SnapshotError(DomainError):
    code = ErrorCode.INVALID_STATE


def follow(kind: str, pk: int, countdown: float | None = None) -> None:
    enqueue_on_commit("console.snapshots.tasks.follow", kind, pk, countdown=countdown)


def _lock_instance(instance: Instance) -> Instance:
    locked = locks.instance_to_change(instance.pk)
    if locked is None or locked.state == S.TERMINATED:
        raise SnapshotError("This instance no longer exists.", code=ErrorCode.NOT_FOUND, status=404)
    return locked


def _new_snapshot(instance: Instance, kind: str, actor=None, shelf=None) -> Snapshot:
    """A snapshot of the (locked) instance's disk on the host that holds it, started."""
    if instance.disk_host_id is None:
        shelved = Shelf.objects.filter(instance=instance).exists()
        raise SnapshotError(
            f"{instance.name} is shelved: its disk is in its shelve's snapshot."
            if shelved
            else f"{instance.name} has no disk yet: it never ran."
        )
    size = instance.disk_gib or AGENT_DISK_GIB
    return _started(instance, instance.disk_host_id, size, kind, actor, shelf)


def _lock_volume(volume: Volume) -> Volume:
    locked = volume_locks.volume(volume.pk)
    if locked is None or locked.deleted_at is not None:
        raise SnapshotError("This volume no longer exists.", code=ErrorCode.NOT_FOUND, status=404)
    return locked


def _new_volume_snapshot(volume: Volume, kind: str, actor=None, shelf=None) -> Snapshot:
    """A snapshot of the (locked) volume's disk on its host, started."""
    if volume.host_id is None:
        raise SnapshotError(
            f"Volume {volume.name} has no disk yet: it is made when an instance it is attached "
            "to first runs."
        )
    return _started(volume, volume.host_id, volume.size_gib, kind, actor, shelf)


def _started(
    source: Instance | Volume, host_id: int, size_gib: int, kind: str, actor, shelf
) -> Snapshot:
    """A snapshot of the source's disk (an instance's own or a volume) on the host that holds
    it, at its region's price, started."""
    snapshot = Snapshot.objects.create(
        tenant_id=source.tenant_id,
        region_id=source.region_id,
        instance=source if isinstance(source, Instance) else None,
        volume=source if isinstance(source, Volume) else None,
        source_name=source.name,
        disk_name=source.disk_name,
        size_gib=size_gib,
        host_id=host_id,
        kind=kind,
        shelf=shelf,
        price_per_gib_month=source.region.snapshot_price_per_gib_month,
        created_by=actor if getattr(actor, "pk", None) else None,
    )
    follow("snapshot", snapshot.pk)
    return snapshot


def _shown(snapshot: Snapshot) -> dict:
    """What the audit log keeps of a snapshot."""
    return {
        "source_name": snapshot.source_name,
        "instance": snapshot.instance_id,
        "volume": snapshot.volume_id,
        "kind": snapshot.kind,
        "state": snapshot.state,
        "deleted_at": snapshot.deleted_at,
    }


def take_snapshot(instance: Instance, *, actor=None, kind: str = Snapshot.Kind.ON_DEMAND):
    """Snapshot the instance's disk now, whether it runs (crash-consistent: what its file
    system holds at that moment) or is stopped."""
    with transaction.atomic():
        instance = _lock_instance(instance)
        snapshot = _new_snapshot(instance, kind, actor)
        lifecycle.note(instance, f"Snapshot {snapshot.pk} of its disk requested", actor=actor)
        audit.record("snapshot.take", snapshot, after=_shown(snapshot))
    return snapshot


def take_volume_snapshot(volume: Volume, *, actor=None) -> Snapshot:
    """Snapshot the volume now, attached (crash-consistent while its instance runs) or not."""
    with transaction.atomic():
        volume = _lock_volume(volume)
        snapshot = _new_volume_snapshot(volume, Snapshot.Kind.ON_DEMAND, actor)
        audit.record("snapshot.take", snapshot, after=_shown(snapshot))
    return snapshot


def delete_snapshot(snapshot: Snapshot, *, actor=None) -> Snapshot:
    """Delete the snapshot: no longer billed from now, and forgotten by the store (its data
    pruned where no other snapshot holds it). A shelved instance's snapshot stays until the
    instance is started or terminated."""
    with transaction.atomic():
        snapshot = snapshot_locks.snapshot(snapshot.pk)
        if snapshot.deleted_at is not None:
            return snapshot
        if snapshot.shelf_id is not None:
            raise SnapshotError(
                "This snapshot holds a shelved instance's disk: start the instance (or "
                "terminate it) first.",
                code=ErrorCode.SNAPSHOT_SHELVED,
            )
        if snapshot.state == RUNNING:
            raise SnapshotError(
                "This snapshot is still being taken.", code=ErrorCode.SNAPSHOT_RUNNING
            )
        if snapshot.restores.filter(state=RUNNING).exists():
            raise SnapshotError(
                "This snapshot is being restored.", code=ErrorCode.SNAPSHOT_RESTORING
            )
        before = _shown(snapshot)
        _delete(snapshot)
        audit.record("snapshot.delete", snapshot, before=before, after=_shown(snapshot))
    return snapshot


def _delete(snapshot: Snapshot) -> None:
    snapshot.deleted_at = timezone.now()
    Snapshot.objects.filter(pk=snapshot.pk).update(deleted_at=snapshot.deleted_at)
    if snapshot.restic_id:
        follow("forget", snapshot.pk)
    else:
        Snapshot.objects.filter(pk=snapshot.pk).update(forgotten=True)


SCHEDULE_FIELDS = ["instance", "volume", "every_hours", "keep"]


def set_schedule(source: Instance | Volume, every_hours: int, keep: int) -> Schedule:
    """Snapshot the instance's disk (or the volume) every `every_hours`, keeping the newest
    `keep` of these (one schedule per instance or volume: this replaces it)."""
    errors = {}
    if not 1 <= every_hours <= MAX_EVERY_HOURS:
        errors["every_hours"] = [f"Between 1 and {MAX_EVERY_HOURS} hours."]
    if not 1 <= keep <= MAX_KEEP:
        errors["keep"] = [f"Between 1 and {MAX_KEEP} snapshots."]
    if errors:
        raise ValidationError(errors)
    of = {"volume": source} if isinstance(source, Volume) else {"instance": source}
    with transaction.atomic():
        schedule = snapshot_locks.schedule(**of)
        before = audit.snapshot(schedule, SCHEDULE_FIELDS) if schedule else None
        schedule, _ = Schedule.objects.update_or_create(
            **of,
            defaults={"tenant_id": source.tenant_id, "every_hours": every_hours, "keep": keep},
        )
        after = audit.snapshot(schedule, SCHEDULE_FIELDS)
        if before is None:
            audit.record("schedule.create", schedule, after=after)
        elif before != after:
            audit.record("schedule.change", schedule, before=before, after=after)
    return schedule


def delete_schedule(schedule: Schedule) -> None:
    """No more scheduled snapshots of its instance or volume (those taken stay)."""
    with transaction.atomic():
        schedule = snapshot_locks.schedule(pk=schedule.pk)
        if schedule is None:
            return
        audit.record("schedule.delete", schedule, before=audit.snapshot(schedule, SCHEDULE_FIELDS))
        schedule.delete()


def run_schedule(schedule_pk: int, now=None) -> Snapshot | None:
    """The schedule's snapshot when it is due (and its instance has a disk), then its
    oldest scheduled snapshots beyond `keep` deleted."""
    now = now or timezone.now()
    with transaction.atomic():
        schedule = snapshot_locks.schedule(pk=schedule_pk)
        if schedule is None or not schedule.due(now):
            return None
        schedule.last_run_at = now
        Schedule.objects.filter(pk=schedule.pk).update(last_run_at=now)
        if schedule.volume_id is not None:
            volume = volume_locks.volume(schedule.volume_id)
            if volume is None or volume.deleted_at is not None or volume.host_id is None:
                return None
            return _new_volume_snapshot(volume, Snapshot.Kind.SCHEDULED)
        instance = locks.instance_to_change(schedule.instance_id)
        if instance is None or instance.state == S.TERMINATED or instance.disk_host_id is None:
            return None
        snapshot = _new_snapshot(instance, Snapshot.Kind.SCHEDULED)
    return snapshot


def prune_schedule(schedule_pk: int) -> int:
    """Delete the scheduled snapshots of the schedule's instance or volume beyond its `keep`,
    oldest first (done ones only: a running one is counted when it is done). Answers how many
    went."""
    with transaction.atomic():
        schedule = snapshot_locks.schedule(pk=schedule_pk)
        if schedule is None:
            return 0
        done = snapshot_locks.snapshots(
            instance_id=schedule.instance_id,
            volume_id=schedule.volume_id,
            kind=Snapshot.Kind.SCHEDULED,
            state=DONE,
            deleted_at__isnull=True,
        )
        for snapshot in done[schedule.keep :]:
            _delete(snapshot)
    return max(0, len(done) - schedule.keep)


# --- shelve -------------------------------------------------------------------------------


def shelve_instance(instance: Instance, *, actor=None) -> Shelf:
    """Shelve a stopped instance: its disk and its attached volumes are snapshotted, then
    removed from their host. It then holds nothing on any host and costs only the snapshots'
    storage (and its volumes, as ever); starting it places it on any host that fits and
    restores its disk and volumes there first."""
    with transaction.atomic():
        instance = _lock_instance(instance)
        if instance.state not in SHELVABLE:
            raise SnapshotError(
                f"Only a stopped instance can be shelved; {instance.name} is {instance.state}."
            )
        shelf = Shelf.objects.filter(instance=instance).first()
        if shelf is not None:
            raise SnapshotError(
                f"{instance.name} is {shelf.state} already.", code=ErrorCode.SHELVED
            )
        shelf = Shelf.objects.create(instance=instance, host_id=instance.disk_host_id)
        snapshot = _new_snapshot(instance, Snapshot.Kind.SHELVE, actor, shelf)
        of_volumes = [
            _new_volume_snapshot(volume, Snapshot.Kind.SHELVE, actor, shelf)
            for volume in volume_locks.of_instance(instance.pk)
            if volume.deleted_at is None and volume.host_id == instance.disk_host_id
        ]
        lifecycle.announce_note(
            instance,
            f"Shelving: snapshot {snapshot.pk} of its disk requested"
            + "".join(f", {s.pk} of volume {s.source_name}" for s in of_volumes),
            actor=actor,
        )
        audit.record(
            "instance.shelve",
            instance,
            before={"shelf": None},
            after={
                "shelf": shelf.state,
                "snapshot": snapshot.pk,
                "volume_snapshots": [s.pk for s in of_volumes],
            },
        )
    return shelf


# --- a volume's snapshot into a new volume -------------------------------------------------


def restore_hosts(region_ids):
    """The hosts a snapshot may be restored on: its region's that take new work."""
    return Host.objects.filter(region_id__in=region_ids, status__in=Host.SCHEDULABLE).order_by("pk")


def restore_to_volume(
    snapshot: Snapshot, *, name: str, size_gib: int | None = None, host: str = "", actor=None
) -> Restore:
    """A new volume `name` of the snapshot's tenant, filled from the snapshot on `host` (a
    host's name; default: the host it was taken on when that takes new work, else the
    region's first that does). At least the snapshot's size; billed as a volume from now.
    An instance the new volume is attached to waits for the restore before it starts."""
    size_gib = snapshot.size_gib if size_gib is None else size_gib
    if not isinstance(size_gib, int) or size_gib < snapshot.size_gib:
        raise ValidationError(
            {"size_gib": [f"At least the snapshot's size, {snapshot.size_gib} GiB."]}
        )
    hosts = restore_hosts([snapshot.region_id])
    if host:
        target = hosts.filter(name=host).first()
        if target is None:
            raise ValidationError({"host": [f"No host {host} of this region takes new work."]})
    else:
        target = hosts.filter(pk=snapshot.host_id).first() or hosts.first()
        if target is None:
            raise SnapshotError("No host of this region takes new work now: try again later.")
    with transaction.atomic():
        snapshot = snapshot_locks.snapshot(snapshot.pk)
        if snapshot.deleted_at is not None:
            raise SnapshotError(
                "This snapshot no longer exists.", code=ErrorCode.NOT_FOUND, status=404
            )
        if snapshot.state != DONE:
            raise SnapshotError(f"Snapshot {snapshot.pk} is {snapshot.state}, not done.")
        volume = volumes.create_volume(
            snapshot.tenant,
            name=name,
            size_gib=size_gib,
            region=snapshot.region,
            actor=actor,
            host=target,
        )
        restore = Restore.objects.create(
            snapshot=snapshot,
            tenant_id=snapshot.tenant_id,
            volume=volume,
            host=target,
            disk_name=volume.disk_name,
        )
        audit.record(
            "snapshot.restore",
            snapshot,
            after={"volume": volume.pk, "volume_name": volume.name, "host": target.name},
        )
        follow("restore", restore.pk)
    return restore


def _volume_restored(restore: Restore) -> None:
    """The new volume holds the snapshot's data: an instance it is attached to that waits
    for it goes on."""
    volume = Volume.objects.get(pk=restore.volume_id)
    _say(
        restore.snapshot,
        "snapshot.done",
        f"Snapshot {restore.snapshot_id} was restored into volume {volume.name}",
    )
    if volume.instance_id is not None:
        enqueue_on_commit("console.instances.tasks.provision", volume.instance_id)


def _volume_restore_failed(restore: Restore) -> None:
    """The new volume holds no whole copy: deleted when it is attached to nothing (its billing
    ends), else an instance that waits for it fails."""
    volume = Volume.objects.get(pk=restore.volume_id)
    _say(
        restore.snapshot,
        "snapshot.failed",
        f"Snapshot {restore.snapshot_id} could not be restored into volume {volume.name}: "
        f"{restore.error}"[:300],
    )
    if volume.deleted_at is not None:
        return
    if volume.instance_id is None:
        volumes.delete_volume(volume)
        return
    outcomes.fail_instance(
        volume.instance_id,
        Reason(
            detail=f"Volume {volume.name} could not be restored from its snapshot: {restore.error}"[
                :200
            ]
        ),
    )


def _not_shelved(shelf: Shelf) -> None:
    """The shelve is given up: its snapshots stay as the tenant's own (deletable), the shelf
    goes."""
    shelf.snapshots.update(shelf=None, kind=Snapshot.Kind.ON_DEMAND)
    shelf.delete()


def _shelved(snapshot: Snapshot) -> None:
    """A shelve's snapshot is done; once all are (its disk's and its volumes'), the instance,
    still stopped on the same host, is shelved and its disk and volumes removed there; one
    started meanwhile stays as it is. A volume detached meanwhile keeps its disk (its
    snapshot stays as the tenant's own)."""
    with transaction.atomic():
        # the instance first, then its shelf, as shelve and terminate lock them
        shelved = Shelf.objects.filter(pk=snapshot.shelf_id).values_list("instance_id", flat=True)
        instance_id = shelved.first()
        instance = locks.instance_to_change(instance_id) if instance_id else None
        shelf = snapshot_locks.shelf(pk=snapshot.shelf_id)
        if shelf is None or shelf.state != Shelf.State.SHELVING:
            return
        snapshots = snapshot_locks.shelf_snapshots(shelf)
        if instance is None or any(s.state != DONE for s in snapshots):
            return
        if instance.state not in SHELVABLE or instance.disk_host_id != shelf.host_id:
            _not_shelved(shelf)
            lifecycle.announce_note(instance, f"Not shelved: it is {instance.state} meanwhile")
            return
        volumes = []
        for each in snapshots:
            volume = each.volume
            if volume is None:
                continue
            if volume.instance_id == instance.pk and volume.host_id == shelf.host_id:
                volumes.append(volume)
            else:
                Snapshot.objects.filter(pk=each.pk).update(shelf=None, kind=Snapshot.Kind.ON_DEMAND)
        Instance.objects.filter(pk=instance.pk).update(disk_host=None)
        Volume.objects.filter(pk__in=[v.pk for v in volumes]).update(host=None)
        shelf.state, shelf.shelved_at = Shelf.State.SHELVED, timezone.now()
        shelf.save(update_fields=["state", "shelved_at"])
        held = (
            f"its disk and volumes {', '.join(v.name for v in volumes)} are"
            if volumes
            else "its disk is"
        )
        lifecycle.record_shelved(
            instance,
            f"Shelved: {held} in snapshots; it holds nothing on "
            f"{shelf.host.name if shelf.host else 'its host'} any more",
        )
        enqueue_on_commit("console.snapshots.tasks.remove_disk", instance.pk, shelf.host_id)
        for volume in volumes:
            enqueue_on_commit(
                "console.snapshots.tasks.remove_volume_disk", volume.pk, shelf.host_id
            )


def hold_for_restore(instance_pk: int, host: Host) -> bool:
    """The provision task's hold (console.instances.hooks.ProvisionHold): a shelved
    instance placed on `host` waits while its disk and volumes are restored there
    (restore_done queues the provisioning again), as does one whose volume is being restored
    from a snapshot into it."""
    if Restore.objects.filter(
        volume__instance_id=instance_pk, state=RUNNING, volume__host_id=host.pk
    ).exists():
        return True  # a volume of its is being restored: restore_done goes on
    with transaction.atomic():
        shelf = snapshot_locks.shelf(instance_id=instance_pk)
        if shelf is None or shelf.state == Shelf.State.SHELVING:
            return False
        if shelf.state == Shelf.State.UNSHELVING and shelf.host_id == host.pk:
            return True
        done = shelf.snapshots.filter(state=DONE).select_related("volume")
        snapshot = done.filter(volume__isnull=True).order_by("-finished_at").first()
        instance = Instance.objects.get(pk=instance_pk)
        shelf.state, shelf.host = Shelf.State.UNSHELVING, host
        shelf.save(update_fields=["state", "host"])
        restores = [
            Restore(
                snapshot=snapshot,
                tenant_id=instance.tenant_id,
                instance=instance,
                host=host,
                disk_name=instance.disk_name,
                shelf=shelf,
            )
        ]
        for each in done.filter(volume__isnull=False).order_by("pk"):
            Volume.objects.filter(pk=each.volume_id).update(host=host)
            restores.append(
                Restore(
                    snapshot=each,
                    tenant_id=instance.tenant_id,
                    volume=each.volume,
                    host=host,
                    disk_name=each.volume.disk_name,
                    shelf=shelf,
                )
            )
        lifecycle.announce_note(
            instance,
            f"Unshelving: restoring its disk from snapshot {snapshot.pk}"
            + "".join(f", volume {r.volume.name} from {r.snapshot_id}" for r in restores[1:])
            + f" on {host.name}",
        )
        for restore in restores:
            restore.save()
            follow("restore", restore.pk)
    return True


def _restored(restore: Restore) -> None:
    """A shelved instance's disk or volume is on its new host; once all are, the shelf goes,
    its snapshots are forgotten (the disks are the instance's and the volumes' again) and
    the provisioning goes on."""
    with transaction.atomic():
        shelf = snapshot_locks.shelf(pk=restore.shelf_id)
        if shelf is None or shelf.host_id != restore.host_id:
            _discard(restore)  # its unshelve was given up (one of its restores failed)
            return
        if shelf.restores.filter(host_id=shelf.host_id, state=RUNNING).exists():
            return
        snapshots = snapshot_locks.shelf_snapshots(shelf)
        shelf.delete()
        for snapshot in snapshots:
            if snapshot.deleted_at is None:
                _delete(snapshot)
        instance = Instance.objects.get(pk=shelf.instance_id)
        lifecycle.announce_note(
            instance, f"Unshelved: its disk was restored on {restore.host.name}"
        )
        enqueue_on_commit("console.instances.tasks.provision", instance.pk)


def _restore_failed(restore: Restore) -> None:
    """The unshelve is given up: the instance stays shelved (its snapshots are whole) and
    fails, its disk and volumes on no host, so that a start tries again on any host of its
    region. What this unshelve restored on the host leaves it: the restores that ended now,
    the others as they end (_restored)."""
    with transaction.atomic():
        # the instance first, then its shelf, as shelve and terminate lock them
        shelved = Shelf.objects.filter(pk=restore.shelf_id).values_list("instance_id", flat=True)
        instance_id = shelved.first()
        instance = locks.instance_to_change(instance_id) if instance_id is not None else None
        shelf = snapshot_locks.shelf(pk=restore.shelf_id)
        unshelving = shelf is not None and shelf.state == Shelf.State.UNSHELVING
        if not unshelving or shelf.host_id != restore.host_id:
            _discard(restore)  # of an unshelve given up already (by another of its restores)
            return
        host = shelf.host
        shelf.state, shelf.host = Shelf.State.SHELVED, None
        shelf.save(update_fields=["state", "host"])
        Volume.objects.filter(pk__in=shelf.snapshots.values("volume_id")).update(host=None)
        Instance.objects.filter(pk=shelf.instance_id).update(disk_host=None)
        lifecycle.record_shelved(instance, f"Shelved again: nothing of it stays on {host.name}")
        for ended in shelf.restores.filter(host=host).exclude(state=RUNNING):
            _discard(ended)
    what = f"volume {restore.volume.name}" if restore.volume_id else "disk"
    then = ". It stays shelved with its snapshots: a start restores them again, on any host"
    said = f"Its {what} could not be restored on {restore.host.name}: {restore.error}"
    outcomes.fail_instance(shelf.instance_id, Reason(detail=said[: 200 - len(then)] + then))


def _discard(restore: Restore) -> None:
    """What a restore of a given-up unshelve wrote on its host leaves that host (the shelve's
    snapshots still hold it): the removal skips a disk that a later start put there again."""
    if restore.volume_id is not None:
        enqueue_on_commit(
            "console.snapshots.tasks.remove_volume_disk", restore.volume_id, restore.host_id
        )
    elif restore.instance_id is not None:
        enqueue_on_commit(
            "console.snapshots.tasks.remove_disk", restore.instance_id, restore.host_id
        )


def on_instance_terminated(sender, instance, from_state, to_state, at, **kwargs) -> None:
    """A shelved instance terminated: its disk's snapshot goes with it. Its volumes (detached
    by the terminate) held no disk any more: they are deleted, and their snapshots stay as
    the tenant's own, to restore into new volumes."""
    if to_state != S.TERMINATED:
        return
    with transaction.atomic():
        shelf = snapshot_locks.shelf(instance_id=instance.pk)
        if shelf is None:
            return
        snapshots = snapshot_locks.shelf_snapshots(shelf)
        _not_shelved(shelf)
        for snapshot in snapshots:
            volume = snapshot.volume
            if volume is None:
                if snapshot.deleted_at is None and snapshot.state != RUNNING:
                    _delete(snapshot)
            elif volume.host_id is None and volume.instance_id is None:
                volumes.delete_volume(volume)
                lifecycle.announce_note(
                    instance,
                    f"Volume {volume.name} was deleted with it: its data is in snapshot "
                    f"{snapshot.pk}, to restore into a new volume",
                )


# --- what the tasks record ------------------------------------------------------------------


def record_progress(row, view: dict) -> None:
    """A running job's progress from its agent's view."""
    type(row).objects.filter(pk=row.pk, state=RUNNING).update(
        bytes_done=int(view.get("bytes_done") or 0),
        bytes_total=int(view.get("bytes_total") or 0),
        eta_seconds=view.get("eta_seconds"),
    )


def _say(snapshot: Snapshot, kind: str, text: str) -> None:
    transaction.on_commit(
        lambda: notice.send(
            sender=__name__,
            tenant=snapshot.tenant,
            kind=kind,
            subject=snapshot,
            text=text,
            data={"snapshot": snapshot.pk, "source": snapshot.source_name},
        )
    )


def snapshot_done(snapshot_pk: int, view: dict) -> None:
    result = view.get("result") or {}
    with transaction.atomic():
        snapshot = snapshot_locks.snapshot(snapshot_pk)
        if snapshot is None or snapshot.state != RUNNING:
            return
        snapshot.state, snapshot.finished_at = DONE, timezone.now()
        snapshot.restic_id = str(result.get("snapshot") or "")
        snapshot.bytes_total = snapshot.bytes_done = int(result.get("bytes_total") or 0)
        snapshot.bytes_stored = int(result.get("bytes_added") or 0)
        snapshot.eta_seconds = 0
        snapshot.save()
        record_measurement(snapshot, result)
        _say(snapshot, "snapshot.done", f"Snapshot {snapshot.pk} of {snapshot.source_name} is done")
        if snapshot.shelf_id is not None:
            _shelved(snapshot)
        elif snapshot.kind == Snapshot.Kind.SCHEDULED:
            of = Q(instance_id=snapshot.instance_id) if snapshot.instance_id else None
            if snapshot.volume_id:
                of = Q(volume_id=snapshot.volume_id)
            schedule = Schedule.objects.filter(of).first() if of is not None else None
            if schedule is not None:
                transaction.on_commit(lambda: prune_schedule(schedule.pk))


def snapshot_failed(snapshot_pk: int, error: str) -> None:
    with transaction.atomic():
        snapshot = snapshot_locks.snapshot(snapshot_pk)
        if snapshot is None or snapshot.state != RUNNING:
            return
        snapshot.state, snapshot.finished_at, snapshot.error = FAILED, timezone.now(), error[:300]
        snapshot.save()
        _say(
            snapshot,
            "snapshot.failed",
            f"Snapshot {snapshot.pk} of {snapshot.source_name} failed: {snapshot.error}",
        )
        shelf = Shelf.objects.filter(pk=snapshot.shelf_id, state=Shelf.State.SHELVING).first()
        if shelf is not None:
            _not_shelved(shelf)
            instance = Instance.objects.get(pk=shelf.instance_id)
            lifecycle.announce_note(instance, f"Not shelved: its snapshot failed ({error})"[:300])


def restore_done(restore_pk: int, view: dict) -> None:
    with transaction.atomic():
        restore = snapshot_locks.restore(restore_pk)
        if restore is None or restore.state != RUNNING:
            return
        restore.state, restore.finished_at = DONE, timezone.now()
        restore.bytes_done = restore.bytes_total = int(view.get("bytes_total") or 0)
        restore.eta_seconds = 0
        restore.save()
        if restore.shelf_id is not None:
            _restored(restore)
        elif restore.volume_id is not None:
            _volume_restored(restore)


def restore_failed(restore_pk: int, error: str) -> None:
    with transaction.atomic():
        restore = snapshot_locks.restore(restore_pk)
        if restore is None or restore.state != RUNNING:
            return
        restore.state, restore.finished_at, restore.error = FAILED, timezone.now(), error[:300]
        restore.save()
        if restore.shelf_id is None and restore.volume_id is not None:
            _volume_restore_failed(restore)
    if restore.shelf_id is not None:
        _restore_failed(restore)


def forgotten(snapshot_pk: int, view: dict) -> None:
    with transaction.atomic():
        snapshot = snapshot_locks.snapshot(snapshot_pk)
        if snapshot is None or snapshot.forgotten:
            return
        Snapshot.objects.filter(pk=snapshot.pk).update(forgotten=True)
        record_measurement(snapshot, view.get("result") or {})


def record_measurement(snapshot: Snapshot, result: dict) -> StoreMeasurement | None:
    """What the tenant's repository holds now, as the agent measured it after the job on
    `snapshot` (its `store`; none when the agent could not tell, or of the shared repository):
    billed from this second on, at the price of the snapshot's region, and each snapshot's
    share of it, shown on the snapshot. A malformed measurement is left out (the last one
    stands)."""
    if snapshot.store != Snapshot.Store.TENANT or "store" not in result:
        return None
    try:
        total, held = _measured(result["store"])
    except (TypeError, ValueError, KeyError, AttributeError):
        log.warning("snapshot %s: a malformed store measurement: %.200r", snapshot.pk, result)
        return None
    for row in Snapshot.objects.filter(
        tenant_id=snapshot.tenant_id, store=Snapshot.Store.TENANT, restic_id__in=list(held)
    ):
        unique, shared = held[row.restic_id]
        Snapshot.objects.filter(pk=row.pk).update(bytes_unique=unique, bytes_shared=shared)
    return StoreMeasurement.objects.create(
        tenant_id=snapshot.tenant_id,
        measured_at=timezone.now().replace(microsecond=0),
        bytes=total,
        price_per_gib_month=snapshot.region.snapshot_price_per_gib_month,
    )


def _measured(store: dict) -> tuple[int, dict[str, tuple[int, int]]]:
    """(the repository's bytes, {restic id: (unique, shared) bytes}) from an agent's `store`;
    ValueError when a figure is not a whole number of bytes."""

    def size(value) -> int:
        if type(value) is not int or value < 0:
            raise ValueError(f"not a number of bytes: {value!r}")
        return value

    held = {
        str(restic_id): (size(share["unique"]), size(share["shared"]))
        for restic_id, share in (store.get("snapshots") or {}).items()
    }
    return size(store["bytes"]), held
