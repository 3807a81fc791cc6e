"""What mends the database when a host or a worker failed: failover of the instances of hosts
that stayed silent, and reconcile's help (requeue what a lost task left stuck, re-drive a
launch that never reached its agent)."""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.fleet.models import Host
from console.fleet.services import hosts_to_fail_over
from console.instances import locks, outcomes, queue
from console.instances.models import Allocation, Instance, State
from console.instances.signals import host_lost

log = logging.getLogger(__name__)

S = State


# --- hosts that went silent ---------------------------------------------------------------

HOST_UNREACHABLE = "host_unreachable"


def fail_over_hosts(now: datetime | None = None) -> int:
    """Instances on hosts unreachable for longer than HOST_FAILOVER_SECONDS: failed (reason
    host_unreachable, at the host's last heartbeat, where billing stops) and their slices
    freed. A stop or a terminate that was under way completes instead; hosts that went silent
    together with most of the fleet are left alone (fleet.services.hosts_to_fail_over).
    Answers how many instances were moved."""
    moved = 0
    for host in hosts_to_fail_over(now or timezone.now()):
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
        detail = f"{HOST_UNREACHABLE}: host stopped answering at {at:%Y-%m-%d %H:%M:%S} UTC"
        if instance.state == S.STOPPING:
            outcomes.stop_here(instance, message=f"Stopped; {detail}")
            return True
        if instance.state == S.TERMINATING:
            outcomes.terminate_here(instance, message=f"Terminated; {detail}")
            return True
    return outcomes.fail_instance(instance_pk, HOST_UNREACHABLE, allocation_id=allocation_id, at=at)


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
