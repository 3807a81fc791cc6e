"""Celery tasks of snapshots: follow a job on a host agent until it ends (each poll a task of
its own, queued again while the job runs, so that no worker waits on a long restic run), the
schedules' beat, and the removal of a shelved instance's disk and volumes from its old host
(or from the host where its unshelve failed)."""

import logging

from celery import shared_task
from django.conf import settings
from django.db.models import Q

from console.fleet import agent_client
from console.fleet.agent_client import AgentRejected, AgentUnavailable
from console.fleet.models import Host
from console.instances.models import Instance
from console.snapshots import services
from console.snapshots import store as stores
from console.snapshots.models import Restore, Schedule, Snapshot
from console.volumes.models import Volume

log = logging.getLogger(__name__)

RUNNING = Snapshot.State.RUNNING
# The options of a task that asks a host agent: redelivered when its worker dies, tried again
# with backoff while the agent does not answer.
ASKS_AN_AGENT = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    "autoretry_for": (AgentUnavailable,),
    "retry_backoff": settings.INSTANCE_AGENT_RETRY_BACKOFF,
    "retry_backoff_max": settings.INSTANCE_AGENT_RETRY_BACKOFF_MAX,
    "max_retries": settings.INSTANCE_AGENT_MAX_RETRIES,
}


def _backup(snapshot: Snapshot) -> tuple[Host | None, str, dict]:
    body = {
        "kind": "backup",
        "store": stores.for_snapshot(snapshot),
        "volume": snapshot.disk_name,
        "tags": [f"tenant={snapshot.tenant_id}", f"snapshot={snapshot.pk}"],
        "measure": snapshot.store == Snapshot.Store.TENANT,
    }
    return snapshot.host, snapshot.job_id, body


def _restore(restore: Restore) -> tuple[Host | None, str, dict]:
    """Into a new volume's disk (whose owner is the volume), or a shelved instance's own."""
    snapshot, volume = restore.snapshot, restore.volume
    size = volume.size_gib if volume else max(snapshot.size_gib, restore.instance.disk_gib)
    body = {
        "kind": "restore",
        "store": stores.for_snapshot(snapshot),
        "volume": restore.disk_name,
        "snapshot": snapshot.restic_id,
        "instance": volume.owner if volume else str(restore.instance_id),
        "tenant": str(restore.tenant_id),
        "size_gib": size,
    }
    return restore.host, restore.job_id, body


def _forget(snapshot: Snapshot) -> tuple[Host | None, str, dict]:
    """Any host of the snapshot's region that answers may forget it, with its tenant's store
    (or the shared one of before the split): the one it was taken on first. One job per
    snapshot, so one tenant's store per job. A backup or forget in a tenant's repository
    measures it after (services.record_measurement)."""
    hosts = Host.objects.filter(region_id=snapshot.region_id).exclude(
        Q(status__in=(Host.Status.UNREACHABLE, Host.Status.RETIRED))
    )
    host = hosts.filter(pk=snapshot.host_id).first() or hosts.order_by("pk").first()
    body = {
        "kind": "forget",
        "store": stores.for_snapshot(snapshot),
        "snapshots": [snapshot.restic_id],
        "measure": snapshot.store == Snapshot.Store.TENANT,
    }
    return host, f"forget-{snapshot.pk}", body


KINDS = {
    "snapshot": (
        lambda pk: Snapshot.objects.select_related("host").filter(pk=pk, state=RUNNING).first(),
        _backup,
        services.snapshot_done,
        services.snapshot_failed,
    ),
    "restore": (
        lambda pk: (
            Restore.objects.select_related("host", "snapshot", "instance", "volume")
            .filter(pk=pk, state=RUNNING)
            .first()
        ),
        _restore,
        services.restore_done,
        services.restore_failed,
    ),
    "forget": (
        lambda pk: (
            Snapshot.objects.filter(pk=pk, deleted_at__isnull=False, forgotten=False)
            .exclude(restic_id="")
            .first()
        ),
        _forget,
        services.forgotten,
        lambda pk, error: log.warning("snapshot %s could not be forgotten: %s", pk, error),
    ),
}


@shared_task(bind=True, name="console.snapshots.tasks.follow", **ASKS_AN_AGENT)
def follow(self, kind: str, pk: int) -> None:
    """Start the job (idempotent: the same id and body answer the job as it stands) and
    record what it says: its progress, then its outcome. A job its agent refuses fails; one
    whose agent stops answering fails when the retries run out."""
    read, job, done, failed = KINDS[kind]
    row = read(pk)
    if row is None:
        return
    try:
        host, job_id, body = job(row)
    except stores.StoreUnavailable as exc:
        failed(pk, str(exc))
        return
    if host is None:
        failed(pk, "no host of its region answers")
        return
    try:
        view = agent_client.start_snapshot_job(host, job_id, body)
    except AgentRejected as exc:
        failed(pk, exc.message)
        return
    except AgentUnavailable as exc:
        if self.request.retries >= self.max_retries:
            failed(pk, f"its host stopped answering: {exc.message}")
            return
        raise
    if view.get("state") == "running":
        if kind != "forget":
            services.record_progress(row, view)
        self.apply_async((kind, pk), countdown=settings.SNAPSHOT_POLL_SECONDS)
    elif view.get("state") == "done":
        done(pk, view.get("result") if kind == "restore" else view)
    else:
        failed(pk, str(view.get("error") or "the job failed"))


@shared_task(name="console.snapshots.tasks.run_schedules")
def run_schedules() -> int:
    """Beat: take the snapshots that are due. Answers how many were started."""
    started = 0
    for pk in Schedule.objects.values_list("pk", flat=True):
        started += services.run_schedule(pk) is not None
    return started


@shared_task(name="console.snapshots.tasks.remove_disk", **ASKS_AN_AGENT)
def remove_disk(instance_pk: int, host_pk: int) -> None:
    """A shelved instance's disk (and kept output) leaves its old host, or the host where its
    unshelve failed; one placed there again meanwhile (its instance started) stays."""
    host = Host.objects.filter(pk=host_pk).first()
    if host is None or Instance.objects.filter(pk=instance_pk, disk_host_id=host_pk).exists():
        return
    try:
        agent_client.delete_instance_data(host, instance_pk)
    except AgentRejected as exc:  # AgentUnavailable: tried again
        log.warning("the disk of shelved instance %s stays on %s: %s", instance_pk, host, exc)


@shared_task(name="console.snapshots.tasks.remove_volume_disk", **ASKS_AN_AGENT)
def remove_volume_disk(volume_pk: int, host_pk: int) -> None:
    """A shelved instance's volume leaves its old host, or the host where its unshelve failed
    (its data is in the shelve's snapshot); one placed there again meanwhile (its instance
    started) stays."""
    volume = Volume.objects.filter(pk=volume_pk).first()
    host = Host.objects.filter(pk=host_pk).first()
    if volume is None or host is None or volume.host_id == host_pk:
        return
    try:
        agent_client.delete_volume(host, volume.disk_name, volume.owner, volume.tenant_id)
    except AgentRejected as exc:  # AgentUnavailable: tried again
        log.warning("the disk of shelved volume %s stays on %s: %s", volume_pk, host, exc)
