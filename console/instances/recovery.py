"""What mends the database when a host or a worker failed: instances of silent hosts marked
unreachable and adopted back when heard again, failover of those of hosts lost, allocations
no one owns, and reconcile's help (requeue what a lost task left stuck, re-drive a
launch that never reached its agent)."""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from console.catalog.models import RestartPolicy
from console.fleet import agent_client
from console.fleet import services as fleet
from console.fleet.models import Host
from console.fleet.signals import host_back
from console.instances import lifecycle, locks, outcomes, queue, reasons
from console.instances.models import Allocation, Instance, OnHostLoss, State, new_disk_name
from console.instances.signals import host_lost

log = logging.getLogger(__name__)

S = State


# --- hosts that went silent ---------------------------------------------------------------


def fail_over_hosts(now: datetime | None = None) -> int:
    """Running instances on unreachable hosts become `unreachable` (mark_unreachable). Those on
    hosts lost (unreachable for HOST_FAILOVER_SECONDS) fail, at the host's last heartbeat (where
    billing stops), with the reason in words, and their slices are freed; a stop or a terminate
    that was under way completes instead. One whose restart policy is not `never` and whose
    launch chose on_host_loss `fresh_disk` is then placed again on a new disk (_on_fresh_disk).
    Hosts that went silent together with most of the fleet are not lost
    (fleet.services.hosts_to_fail_over). Answers how many instances were moved off lost hosts."""
    mark_unreachable()
    moved = 0
    for host in fleet.hosts_to_fail_over(now or timezone.now()):
        at = host.last_heartbeat_at or host.unreachable_since
        rows = (
            Allocation.objects.filter(host=host, released_at__isnull=True)
            .order_by("instance_id")
            .values_list("instance_id", "pk")
        )
        for instance_pk, allocation_id in rows:
            if _fail_over(instance_pk, allocation_id, host, at):
                moved += 1
    return moved


def mark_unreachable() -> int:
    """Running instances whose host is unreachable, or whose host's container engine does not
    answer (its agent, still heard, says so): `unreachable` from the host's last heartbeat, or
    from when the engine stopped answering (billing stops there: nothing vouches that the
    workload ran since), their slices kept, since the workload may well still run (an agent's
    upgrade, a reboot of its unit; an engine restarted with Docker's live-restore, or Podman's
    containers, which outlive its service). adopt() brings them back. Answers how many."""
    rows = Allocation.objects.filter(
        Q(host__status=Host.Status.UNREACHABLE) | Q(host__engine_down_since__isnull=False),
        released_at__isnull=True,
        instance__state=S.RUNNING,
    ).values_list(
        "instance_id",
        "pk",
        "host__name",
        "host__status",
        "host__last_heartbeat_at",
        "host__engine_down_since",
    )
    return sum(_mark_unreachable(*row) for row in rows)


def _mark_unreachable(
    instance_pk: int,
    allocation_id: str,
    host_name: str,
    host_status: str,
    seen: datetime | None,
    engine_down_since: datetime | None,
) -> bool:
    with transaction.atomic():
        instance = locks.instance_to_change(instance_pk)
        if instance is None or instance.state != S.RUNNING:
            return False
        current = instance.current_allocation()
        if current is None or current.pk != allocation_id:
            return False
        silent = host_status == Host.Status.UNREACHABLE or engine_down_since is None
        since = (seen if silent else engine_down_since) or timezone.now()
        last = instance.events.order_by("-at").values_list("at", flat=True).first()
        at = max(since, last) if last is not None else since
        if silent:
            said = f"host {host_name} not heard since {at:%Y-%m-%d %H:%M:%S} UTC"
            reason = reasons.Reason(reasons.Code.HOST_UNREACHABLE, said)
        else:
            said = (
                f"the container engine on host {host_name} does not answer since "
                f"{at:%Y-%m-%d %H:%M:%S} UTC"
            )
            reason = reasons.Reason(reasons.Code.ENGINE_DOWN, said)
        message = f"Unreachable: {said}; it may still run there, and is adopted back if so"
        lifecycle.transition(instance, S.UNREACHABLE, message=message, reason=reason, at=at)
    return True


def adopt(host: Host, instance_pk: int, allocation_id: str) -> bool:
    """The agent of `host`, heard again, still runs the allocation of an unreachable instance:
    running again, as it is (same container, processes and start time). Its container never
    stopped (the engine restarts none by itself), so billing goes on from where it stopped,
    the host's last heartbeat. The same when the host's container engine answers again and
    still runs it (Docker's live-restore, Podman): the engine vouches that it ran meanwhile,
    so the outage is billed; one whose container died with the engine is reported ended by
    the agent instead, and its outage stays unbilled. Never while the engine is still down
    (`host` as read now): the agent cannot tell then. Answers whether it did."""
    if host.engine_down_since is not None:
        return False
    with transaction.atomic():
        instance = locks.instance_to_change(instance_pk)
        if instance is None or instance.state != S.UNREACHABLE:
            return False
        current = instance.current_allocation()
        if current is None or current.pk != allocation_id or current.host_id != host.pk:
            return False
        since = (
            instance.events.filter(to_state=S.UNREACHABLE)
            .order_by("-at", "-pk")
            .values_list("at", flat=True)
            .first()
        )
        message = (
            f"Running: {host.name} is heard again and still runs it (adopted, not restarted); "
            f"billed on from {since:%H:%M:%S} UTC"
        )
        lifecycle.transition(instance, S.RUNNING, message=message, at=since)
    return True


def _fail_over(instance_pk: int, allocation_id: str, host: Host, at: datetime) -> bool:
    with transaction.atomic():
        instance = locks.instance_to_change(instance_pk)
        if instance is None:
            return False
        current = instance.current_allocation()
        if current is None or current.pk != allocation_id:
            # a released allocation that reconcile will tear down; nothing to do here
            return False
        host_lost.send(sender=Instance, instance=instance, at=at)
        lost = f"host {host.name} lost at {at:%Y-%m-%d %H:%M} UTC"
        if instance.state == S.STOPPING:
            outcomes.stop_here(instance, message=f"Stopped; {lost}")
            return True
        if instance.state == S.TERMINATING:
            outcomes.terminate_here(instance, message=f"Terminated; {lost}")
            return True
        if instance.restart_policy == RestartPolicy.NEVER:
            why = "restart policy: never"
        elif instance.on_host_loss == OnHostLoss.KEEP_DISK:
            why = "its disk cannot move; launch with on_host_loss=fresh_disk to come back elsewhere"
        else:
            why = None
    if why is not None:
        reason = reasons.Reason(
            reasons.Code.HOST_LOST, f"{lost}; its disk stays there until the host returns ({why})"
        )
        return outcomes.fail_instance(instance_pk, reason, allocation_id=allocation_id, at=at)
    # one transaction: the quota it holds is never seen free between the two
    with transaction.atomic():
        reason = reasons.Reason(
            reasons.Code.HOST_LOST,
            f"{lost}; it runs again elsewhere on a fresh disk, its old disk stays there",
        )
        if not outcomes.fail_instance(instance_pk, reason, allocation_id=allocation_id, at=at):
            return False
        _on_fresh_disk(instance_pk, host)
    return True


def _on_fresh_disk(instance_pk: int, host: Host) -> None:
    """The instance failed over from the lost `host`, with on_host_loss fresh_disk: placed
    again through the queue on a new, empty disk (starting, or pending while nothing fits),
    from now (its failure closed its billing at the host's last heartbeat). Its old disk
    stays on `host`, which the host's events tell its operators."""
    instance = locks.instance_to_change(instance_pk)
    old_disk = instance.disk_name
    instance.disk_name, instance.disk_host, instance.exit_code = new_disk_name(), None, None
    Instance.objects.filter(pk=instance_pk).update(
        disk_name=instance.disk_name, disk_host=None, exit_code=None
    )
    message = f"Re-placed on a fresh disk after host {host.name} was lost"
    placed = queue.place(
        instance, S.STARTING, message=f"{message}; GPU slice reserved", continues_run=True
    )
    if placed != queue.Placement.PLACED:
        lifecycle.transition(
            instance,
            S.PENDING,
            message=f"{message}; waiting for capacity",
            reason=queue.waiting_reason(instance),
            continues_run=True,
        )
    fleet.report(
        host,
        f"Disk {old_disk} of instance {instance_pk} ({instance.name}) left here: the instance "
        "runs again elsewhere on a fresh disk; delete the old one when the host returns",
    )


def settle_orphan(host: Host, item: dict) -> str:
    """An allocation `host`'s agent holds that the console does not own (`item`, from its
    listing). One the console made whose instance is terminated, or that runs nothing any more
    (the console released it: a stop, a failure), leaves the host as a stop would have taken
    it: "removed" (the disk stays). One that still runs, or that the console never made, is
    never destroyed: its workload is stopped, its container kept, and the host's operators
    told in a host event: "stopped" (or "kept", when it runs nothing). Agent errors propagate."""
    alloc_id = str(item.get("id"))
    known = Allocation.objects.filter(pk=alloc_id).values_list("instance__state", flat=True)
    running = item.get("state") == "running"
    if known and (known[0] == S.TERMINATED or not running):
        agent_client.delete_allocation(host, alloc_id)
        log.info("reconcile: removed allocation %s from %s", alloc_id, host.name)
        return "removed"
    if not running:
        return "kept"
    agent_client.allocation_action(host, alloc_id, "stop")
    instance = (item.get("labels") or {}).get("instance") or "?"
    whose = "an instance the console no longer runs there" if known else "nothing it knows"
    fleet.report(
        host,
        f"Found allocation {alloc_id} (instance {instance}) running, of {whose}: stopped, "
        "kept (not deleted) for an operator to look at",
    )
    return "stopped"


# --- reconcile ----------------------------------------------------------------------------

RECONCILE_STUCK_SECONDS = 300
STUCK_TASKS = {
    S.PROVISIONING: "provision",
    S.STARTING: "provision",
    S.STOPPING: "stop",
    S.TERMINATING: "terminate",
}


def owned_allocations(host: Host) -> dict[str, Allocation]:
    return {
        a.pk: a
        for a in Allocation.objects.filter(host=host, released_at__isnull=True).select_related(
            "instance"
        )
    }


def requeue_stuck(now: datetime | None = None) -> int:
    """Instances in a transitional state for long: their task was lost (a broker restart);
    queue it again (tasks are idempotent, so a late original is harmless)."""
    now = now or timezone.now()
    stuck = Instance.objects.filter(
        state__in=list(STUCK_TASKS),
        updated_at__lt=now - timedelta(seconds=RECONCILE_STUCK_SECONDS),
    ).values_list("pk", "state")
    count = 0
    for pk, state in stuck:
        with transaction.atomic():
            queue.enqueue(STUCK_TASKS[state], pk)
        count += 1
    return count


# --- launches that wait for their host ----------------------------------------------------


def wait_for_host(instance_pk: int) -> bool:
    """A launch or start whose host did not answer through all its retries (an agent
    restarting, a host rebooting) waits for it, its slice held, saying so, for as long as a
    silent host is given before it is failed over (HOST_FAILOVER_SECONDS from the placement):
    the host's return re-drives it at once (host_back, then reconcile_host), and a host that
    stays silent fails it over with the rest (fail_over_hosts). Past that time, or on a host
    retired, answers False: the caller fails it."""
    with transaction.atomic():
        instance = locks.instance_to_change(instance_pk)
        if instance is None or instance.state not in (S.PROVISIONING, S.STARTING):
            return False
        current = instance.current_allocation()
        host = current.host if current is not None else None
        patience = timedelta(seconds=settings.HOST_FAILOVER_SECONDS)
        if host is None or host.status == Host.Status.RETIRED:
            return False
        if timezone.now() - instance.updated_at > patience:
            return False
        minutes = settings.HOST_FAILOVER_SECONDS / 60
        waiting = (
            f"Waiting for its host {host.name}, which does not answer: it goes on when the host "
            f"does (it fails if the host stays away {minutes:.0f} min)."
        )
        instance.set_reason(reasons.Reason(detail=waiting))
        lifecycle.announce_note(instance, instance.state_reason)
    log.info("instance %s waits for its host %s", instance_pk, host.name)
    return True


def redrive_waiting_launches(sender, host: Host, **kwargs) -> None:
    """The host is heard again: the launches and starts that wait for it go on now (the
    provision task is idempotent: one still retrying meanwhile is harmless)."""
    waiting = Instance.objects.filter(
        state__in=(S.PROVISIONING, S.STARTING),
        allocations__host=host,
        allocations__released_at__isnull=True,
    ).values_list("pk", flat=True)
    for instance_pk in waiting:
        queue.enqueue("provision", instance_pk)


host_back.connect(redrive_waiting_launches, dispatch_uid="instances.redrive_waiting_launches")


def redrive_launch(allocation: Allocation, listed_at: datetime) -> bool:
    """A launch whose allocation its agent does not hold although the instance was placed on
    it LAUNCH_REDRIVE_SECONDS before the agent was listed (`listed_at`): its provision task was
    lost (the worker that had it died before reaching the agent), so queue it again. A late
    original is harmless (the agent creates an allocation id once). Answers whether it did."""
    instance = allocation.instance
    placed_long_ago = instance.updated_at < listed_at - timedelta(
        seconds=settings.LAUNCH_REDRIVE_SECONDS
    )
    if instance.state not in (S.PROVISIONING, S.STARTING) or not placed_long_ago:
        return False
    log.info("re-driving the launch of instance %s (allocation %s)", instance.pk, allocation.pk)
    queue.enqueue("provision", instance.pk)
    return True
