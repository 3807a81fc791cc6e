"""The queue: instances waiting for a slice (pending), placed highest priority first, then
oldest, whenever capacity is released or the beat comes; and the one way this app queues its
Celery tasks (after commit, by their pinned names)."""

import enum
import logging

from django.db import transaction

from console.celery import enqueue_on_commit
from console.fleet import images
from console.fleet.models import Host
from console.instances import availability, lifecycle, locks, placement, pulls
from console.instances.models import Instance, State
from console.instances.reasons import Reason

log = logging.getLogger(__name__)

S = State
# What a pending instance's reason says of the host that holds its disk, by its operator's
# status.
ANNOUNCED = {
    Host.Status.DRAINING: "it is being drained",
    Host.Status.MAINTENANCE: "it is in maintenance",
}


class Placement(enum.StrEnum):
    """What an attempt to place an instance came to."""

    PLACED = "placed"
    FULL = "full"  # nothing fits now
    BUSY = "busy"  # other workers kept taking the slices it chose: the scheduler tries again soon


def enqueue(task: str, *args, countdown: float | None = None) -> None:
    """Queue ``console.instances.tasks.<task>`` once the current transaction commits (to run
    `countdown` seconds later if given)."""
    enqueue_on_commit(f"console.instances.tasks.{task}", *args, countdown=countdown)


def kick_scheduler() -> None:
    """Capacity was released: let the queue move now rather than at the next beat."""
    enqueue("schedule_pending")


def waiting_reason(instance: Instance) -> Reason:
    """Why a pending instance waits, in words."""
    return Reason(detail=_waiting(instance))


def _waiting(instance: Instance) -> str:
    host = instance.disk_host
    if not availability.can_ever_place(instance.spec, instance.region, host):
        detail = availability.hardware_detail(instance.spec, instance.region, host)
        return f"Can never be placed: {detail}"
    if host is not None and host.admin_status in Host.ANNOUNCED:
        why = ANNOUNCED[host.admin_status]
        note = f" ({host.operator_note})" if host.operator_note else ""
        return f"Waiting for {host.name}, which holds its disk: {why}{note}."
    if host is not None:
        return (
            f"Waiting for {host.name}, which holds its disk: no {instance.spec.name} free "
            "there now."
        )
    return f"Waiting for capacity: no {instance.spec.name} free in {instance.region.name}."


def place(
    instance: Instance, to_state: str, *, actor=None, message: str, continues_run: bool = False
) -> Placement:
    """Try to give `instance` (locked) a slice now; on success move it to `to_state` (a start
    the platform made: `continues_run`, see lifecycle.transition) and queue its provisioning.
    An instance that has a disk goes only to the host that holds it (a disk does not move
    between hosts)."""
    pinned = placement.pinned_host(instance)
    holding = images.holders(instance.region_id, instance.pull_reference)
    try:
        allocation = placement.allocate(
            instance,
            instance.spec,
            host_pk=pinned,
            holders=holding if pinned is None else frozenset(),  # free to choose: worth a little
        )
    except placement.Busy as exc:
        log.info("%s", exc)
        kick_scheduler()
        return Placement.BUSY
    if allocation is None:
        return Placement.FULL
    lifecycle.transition(
        instance, to_state, actor=actor, message=message, continues_run=continues_run
    )
    if pulling := pulls.pull_note(instance, allocation, pinned, holding):
        lifecycle.note(instance, pulling)
    enqueue("provision", instance.pk)
    return Placement.PLACED


def wait(instance: Instance) -> None:
    """Leave a pending instance waiting, saying why."""
    reason = waiting_reason(instance).fitted()
    if instance.reason != reason:
        instance.set_reason(reason)


def place_pending(instance_pk: int) -> Placement | None:
    """Give one queued instance a slice if one is free (see `place`); None when it is not
    pending (any more) or another worker holds it."""
    with transaction.atomic():
        instance = locks.instance_to_change(instance_pk, skip_locked=True)
        if instance is None or instance.state != S.PENDING:
            return None
        outcome = place(instance, S.PROVISIONING, message="GPU slice reserved")
        if outcome == Placement.FULL:
            wait(instance)
        return outcome


def schedule_pending() -> int:
    """Place queued instances, highest priority first, then oldest. An instance that does not
    fit does not hold back smaller ones behind it (backfill); one spec that does not fit in
    a region (or on the host that holds a disk) is not tried again in the same pass. Answers
    how many were placed."""
    queue = (
        Instance.objects.filter(state=S.PENDING)
        .order_by("-priority", "created_at", "pk")
        .values_list("pk", "spec_id", "region_id", "disk_host_id")
    )
    blocked: set[tuple] = set()
    placed = 0
    for pk, *where in queue:
        if tuple(where) in blocked:
            continue
        outcome = place_pending(pk)
        if outcome == Placement.PLACED:
            placed += 1
        elif outcome == Placement.FULL:
            blocked.add(tuple(where))
    return placed
