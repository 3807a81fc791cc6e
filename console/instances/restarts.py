"""Restarts after a workload ended by itself, by its instance's restart policy: `always` after
any end, `on-failure` after a failure (a non-zero exit, oom_killed, container_lost,
gpu_memory_cap), `never` not at all; a start that never ran (outcomes.NEVER_RAN) is not run
again. Crash-loop backoff: the n-th consecutive restart waits min(10 s × 2^(n-1), 5 min), and
the count starts again once a run lasted 10 minutes. outcomes.record_outcome decides, under the
instance's lock (`schedule`); the `restart` task starts it once the backoff is over (`restart`)."""

import logging
import math
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from accounts import locks as account_locks
from accounts.models import Tenant
from console.catalog.models import RestartPolicy
from console.errors import DomainError
from console.instances import lifecycle, locks, queue, services
from console.instances.models import Instance, State

log = logging.getLogger(__name__)

S = State
BACKOFF_FIRST_SECONDS = 10
BACKOFF_MAX_SECONDS = 300
STEADY_RUN = timedelta(minutes=10)
# Moves that begin a run (running), or a placement whose run has not begun yet.
RUN_BEGINS = (S.PROVISIONING, S.STARTING, S.REBOOTING, S.RUNNING)
# How soon a restart due while its exit's stop is still under way looks again.
STOP_WAIT_SECONDS = 2


def wanted(policy: str, *, failed: bool, never_ran: bool) -> bool:
    """Whether a workload that ended (`failed`: not with exit 0) runs again under `policy`."""
    if never_ran or policy == RestartPolicy.NEVER:
        return False
    return failed or policy == RestartPolicy.ALWAYS


def backoff(n: int) -> int:
    """Seconds the n-th consecutive restart (n ≥ 1) waits."""
    return min(BACKOFF_FIRST_SECONDS * 2 ** min(n - 1, 5), BACKOFF_MAX_SECONDS)


def next_count(count: int, ran_for: timedelta) -> int:
    """The number of the next consecutive restart after a run of `ran_for`."""
    return 1 if ran_for >= STEADY_RUN else count + 1


def describe(state: str, count: int, restart_at: datetime | None, now: datetime) -> str:
    """What the instance page and the API say while a restart waits ("" when none does)."""
    if not lifecycle.waits_for_restart(state, restart_at):
        return ""
    seconds = max(0, math.ceil((restart_at - now).total_seconds()))
    return f"restarting in {seconds} s (restart {count}, backoff)"


def schedule(instance: Instance, *, failed: bool, never_ran: bool, why: str, at: datetime) -> bool:
    """The workload of `instance` (locked, its end just recorded at `at`) ended: when its policy
    wants it and its tenant is active, count the restart, say so in an event and queue the
    `restart` task for when the backoff is over. Answers whether it did."""
    policy = instance.restart_policy
    if not wanted(policy, failed=failed, never_ran=never_ran):
        return False
    if not Tenant.objects.filter(pk=instance.tenant_id, status=Tenant.Status.ACTIVE).exists():
        return False
    # this run began at its last move to running, if it got there after its placement
    began = (
        instance.events.filter(to_state__in=RUN_BEGINS, at__lte=at)
        .exclude(from_state=F("to_state"))
        .order_by("-at", "-pk")
        .values_list("to_state", "at")
        .first()
    )
    ran_for = at - began[1] if began and began[0] == S.RUNNING else timedelta(0)
    count = next_count(instance.restart_count, ran_for)
    delay = backoff(count)
    instance.restart_count = count
    instance.restart_at = timezone.now() + timedelta(seconds=delay)
    Instance.objects.filter(pk=instance.pk).update(
        restart_count=count, restart_at=instance.restart_at
    )
    lifecycle.announce_note(
        instance, f"Restart {count} in {delay} s (restart policy {policy}) after: {why}"
    )
    queue.enqueue("restart", instance.pk, instance.restart_at.isoformat(), countdown=delay)
    return True


def cancel(instance: Instance, message: str, *, actor=None) -> None:
    """The restart that `instance` (locked) waits for will not happen; an event says why."""
    instance.restart_at = None
    Instance.objects.filter(pk=instance.pk).update(restart_at=None)
    lifecycle.announce_note(instance, message, actor=actor)


def restart(instance_pk: int, due: str) -> bool:
    """The `restart` task, once the backoff is over: start the instance again
    (services.start_instance: tenant, quota and budget checked) if it still waits for the
    restart due at `due`. A stop, start or terminate meanwhile changed that: nothing happens.
    Answers whether it started (or queued) it."""
    with transaction.atomic():
        tenant_pk = Instance.objects.filter(pk=instance_pk).values_list("tenant_id", flat=True)
        if not tenant_pk:
            return False
        account_locks.quota(tenant_pk[0])  # a start's lock order: the quota first
        instance = locks.instance_to_change(instance_pk)
        if (
            instance is None
            or instance.restart_at is None
            or instance.restart_at.isoformat() != due
        ):
            return False
        if instance.state == S.STOPPING:  # the stop after its exit is not done yet
            queue.enqueue("restart", instance_pk, due, countdown=STOP_WAIT_SECONDS)
            return False
        if instance.state not in (S.STOPPED, S.FAILED):
            return False
        try:
            services.start_instance(
                instance, message=f"Restart {instance.restart_count}", new_run=False
            )
        except DomainError as error:
            cancel(instance, f"Not restarted: {error}")
            log.info("restart of instance %s refused: %s", instance_pk, error)
            return False
    return True
