"""What the workers and the agents record: a task's job read before it calls a host, and
every outcome afterwards (running, stopped, terminated, failed), whether a task's call
answered it, an agent pushed it as an event, or reconcile found it in the agent's listing.
Each checks the instance's state again under its lock, so a late or repeated report changes
nothing."""

import logging
import re
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from accounts.models import Tenant
from console.catalog.models import Spec
from console.fleet import images
from console.fleet.models import Host
from console.instances import lifecycle, locks, placement, queue, reasons, restarts
from console.instances.models import Allocation, Instance, InstanceEvent, State

log = logging.getLogger(__name__)

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")

S = State


# --- what the tasks record --------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """What a task has to do on a host, read under the instance's lock."""

    instance_pk: int
    state: str
    allocation_id: str | None
    host: Host | None
    request: dict
    # the instance's secrets, sealed: placement.agent_body opens them into the request it sends
    secret_env: dict = field(default_factory=dict, repr=False)
    tenant_id: int | None = None  # whose registry credentials its pull may use


def job(instance_pk: int, states: tuple[str, ...]) -> Job | None:
    """The instance's current allocation if the instance is in one of `states`, else None
    (the task was redelivered, or the instance moved on: nothing to do).

    A plain read, no lock: nothing is written here (on SQLite a transaction would take the
    database's write lock), and whatever the task does next is recorded by a function that
    checks the state again under the lock (mark_running, finish_stop, ...)."""
    instance = (
        Instance.objects.filter(pk=instance_pk).only("pk", "state", "secret_env", "tenant").first()
    )
    if instance is None or instance.state not in states:
        return None
    allocation = (
        Allocation.objects.filter(instance_id=instance_pk, released_at__isnull=True)
        .select_related("host")
        .first()
    )
    return Job(
        instance_pk=instance.pk,
        state=instance.state,
        allocation_id=allocation.pk if allocation else None,
        host=allocation.host if allocation else None,
        request=allocation.request if allocation else {},
        secret_env=instance.secret_env,
        tenant_id=instance.tenant_id,
    )


def mark_running(
    instance_pk: int,
    allocation_id: str,
    message: str = "Running",
    at: datetime | None = None,
    image_digest: str = "",
) -> bool:
    """The agent runs the allocation (since `at`, its time; default now): provisioning/
    starting/rebooting → running. An instance of a suspended tenant never runs: it stops.
    `image_digest`: the digest the agent pulled its image at (pin_digest)."""
    with transaction.atomic():
        instance = locks.instance_to_change(instance_pk)
        if instance is None or instance.state not in (S.PROVISIONING, S.STARTING, S.REBOOTING):
            return False
        allocation = instance.current_allocation()
        if allocation is None or allocation.pk != allocation_id:
            return False
        at = _clamp(instance, at)
        if not tenant_active(instance):
            lifecycle.transition(
                instance, S.STOPPING, message="Stopped: its tenant is suspended", at=at
            )
            queue.enqueue("stop", instance.pk)
            return True
        lifecycle.transition(instance, S.RUNNING, message=message, at=at)
        pin_digest(instance, image_digest)
        if allocation.host.image_settings:  # a host with images
            images.note_held(allocation.host_id, instance.pull_reference)
    return True


def pin_digest(instance: Instance, digest: str) -> bool:
    """Pin a tenant's own image reference to the digest of its first pull (the caller holds
    the instance's lock): every later allocation runs repository@digest (placement.
    agent_request), so a tag moved since runs nothing new. Catalog images are the operator's
    and follow their tag; a digest already pinned stays. Answers whether it pinned."""
    if instance.image_id is not None or instance.image_digest or not DIGEST.fullmatch(digest):
        return False
    instance.image_digest = digest
    Instance.objects.filter(pk=instance.pk).update(image_digest=digest)
    lifecycle.note(instance, f"Pinned {instance.image_reference} to {digest}")
    return True


def tenant_active(instance: Instance) -> bool:
    """Whether the instance's tenant may run anything (a suspended one may not)."""
    return Tenant.objects.filter(pk=instance.tenant_id, status=Tenant.Status.ACTIVE).exists()


def finish_stop(instance_pk: int) -> bool:
    """The agent let go of the slice: release it; stopped (and, for a resize, start again)."""
    with transaction.atomic():
        instance = locks.instance_to_change(instance_pk)
        if instance is None or instance.state != S.STOPPING:
            return False
        stop_here(instance, message="Stopped; GPU slice released")
    return True


def stop_here(instance: Instance, message: str) -> None:
    for allocation in instance.allocations.filter(released_at__isnull=True):
        placement.release(allocation)
    resume = instance.resume_after_stop and tenant_active(instance)
    if instance.resume_after_stop:
        instance.resume_after_stop = False
        Instance.objects.filter(pk=instance.pk).update(resume_after_stop=False)
    # A workload that exited by itself, or a budget or idle stop, stays stopped with that reason.
    kept = instance.exit_code is not None or instance.state_reason_code in reasons.KEPT_ON_STOP
    reason = instance.reason if kept else None
    lifecycle.transition(instance, S.STOPPED, message=message, reason=reason)
    again = f"Starting again as {instance.spec.code}"
    if (
        resume
        and queue.place(instance, S.STARTING, message=again, continues_run=True)
        != queue.Placement.PLACED
    ):
        lifecycle.transition(
            instance,
            S.PENDING,
            message=f"Waiting for capacity to start again as {instance.spec.code}",
            reason=queue.waiting_reason(instance),
            continues_run=True,
        )
    queue.kick_scheduler()


def undo_live_resize(instance_pk: int, allocation_id: str, old_spec_pk: int, detail: str) -> bool:
    """The agent refused a live resize's limits: the instance, still running on that
    allocation, goes back to the spec it had (a note says why; billing follows)."""
    with transaction.atomic():
        instance = locks.instance_to_change(instance_pk)
        if instance is None or instance.state != S.RUNNING:
            return False
        allocation = instance.current_allocation()
        if allocation is None or allocation.pk != allocation_id:
            return False
        refused, old = instance.spec, Spec.objects.get(pk=old_spec_pk)
        allocation.request = {**allocation.request, "resources": placement.resources(old)}
        Allocation.objects.filter(pk=allocation.pk).update(
            request=allocation.request, vcpus=old.vcpus, ram_mib=old.ram_mib
        )
        instance.spec = old
        Instance.objects.filter(pk=instance.pk).update(spec=old, updated_at=timezone.now())
        lifecycle.record_live_change(
            instance, f"Resize to {refused.code} undone, it stays {old.code}: {detail}"
        )
    return True


def finish_terminate(instance_pk: int, message: str = "Terminated") -> bool:
    with transaction.atomic():
        instance = locks.instance_to_change(instance_pk)
        if instance is None or instance.state != S.TERMINATING:
            return False
        terminate_here(instance, message)
    return True


def terminate_here(instance: Instance, message: str) -> None:
    for allocation in instance.allocations.filter(released_at__isnull=True):
        placement.release(allocation)
    if instance.resume_after_stop:
        Instance.objects.filter(pk=instance.pk).update(resume_after_stop=False)
    lifecycle.transition(instance, S.TERMINATED, message=message)
    queue.kick_scheduler()


def disk_to_delete(instance_pk: int) -> Host | None:
    """The host that holds a terminating instance's disk (and kept logs), if it has one."""
    instance = Instance.objects.select_related("disk_host").filter(pk=instance_pk).first()
    return instance.disk_host if instance is not None else None


def kept_disk(instance_pk: int):
    """The volume a terminating instance's disk was kept as (terminate's keep_disk), if any."""
    instance = Instance.objects.filter(pk=instance_pk).first()
    return getattr(instance, "kept_disk", None)


def allocations_to_tear_down(instance_pk: int) -> list[Allocation]:
    """Every allocation of a terminating instance that may still exist on a host."""
    return list(
        Allocation.objects.filter(instance_id=instance_pk, released_at__isnull=True).select_related(
            "host"
        )
    )


def fail_instance(
    instance_pk: int,
    reason: reasons.Reason,
    *,
    allocation_id: str | None = None,
    at: datetime | None = None,
    only_states: tuple[str, ...] | None = None,
    exit_code: int | None = None,
    never_ran: bool = False,
) -> bool:
    """Something went wrong on the host side: failed, with the reason (and the workload's
    exit code, when it ended by itself), and its slice freed (the agent's copy, if any, is
    torn down by reconcile). With `allocation_id`, only if that is still the instance's
    current allocation. A workload that `never_ran` fails at the start of its run, if the
    console saw one begin (billing bills no run then)."""
    with transaction.atomic():
        instance = locks.instance_to_change(instance_pk)
        if instance is None or not lifecycle.can(instance.state, S.FAILED):
            return False
        if only_states is not None and instance.state not in only_states:
            return False
        current = instance.current_allocation()
        if allocation_id is not None and (current is None or current.pk != allocation_id):
            return False
        for allocation in instance.allocations.filter(released_at__isnull=True):
            placement.release(allocation)
        if instance.resume_after_stop:
            instance.resume_after_stop = False
            Instance.objects.filter(pk=instance.pk).update(resume_after_stop=False)
        if exit_code is not None:
            instance.exit_code = exit_code
            Instance.objects.filter(pk=instance.pk).update(exit_code=exit_code)
        if never_ran and instance.state == S.RUNNING:
            at = instance.events.filter(to_state=S.RUNNING).order_by("-at").first().at
        at = _clamp(instance, at) if at is not None else None
        lifecycle.transition(instance, S.FAILED, message=reason.text, reason=reason, at=at)
        queue.kick_scheduler()
    return True


def _clamp(instance: Instance, at: datetime | None) -> datetime:
    """The time an agent gives for an outcome, not later than now and not earlier than the
    instance's last transition (its allocation's placement, or what the console recorded
    since: billing closes there). Notes (progress, sessions) do not count: they carry the
    time they were recorded, and a late batch of events must keep the times of its own."""
    now = timezone.now()
    at = min(at or now, now)
    last = (
        instance.events.exclude(from_state=F("to_state"))
        .order_by("-at")
        .values_list("at", flat=True)
        .first()
    )
    return max(at, last) if last is not None else at


# --- what the agents report ---------------------------------------------------------------

# States in which the workload of the current allocation is (being) run by its agent.
WORKLOAD_STATES = (S.PROVISIONING, S.STARTING, S.REBOOTING, S.RUNNING, S.UNREACHABLE)
ENDED = ("exited", "failed", "lost")
# Reasons of a failure before the workload ran (the container may have started, its command
# never did): the run, if the console saw one begin, ends where it began and costs nothing.
NEVER_RAN = (
    reasons.Code.COMMAND_NOT_FOUND,
    reasons.Code.IMAGE_NOT_FOUND,
    reasons.Code.IMAGE_PULL_FAILED,
    reasons.Code.REGISTRY_UNREACHABLE,
    reasons.Code.REGISTRY_NEEDS_CREDENTIALS,
    reasons.Code.REGISTRY_REFUSED_CREDENTIALS,
    reasons.Code.LAUNCH_FAILED,
)


@dataclass(frozen=True)
class Outcome:
    """What an agent says of one of its allocations: in an answer to a call, an event it
    pushes, or its listing (reconcile)."""

    allocation_id: str
    state: str
    reason: str = ""
    exit_code: int | None = None
    at: datetime | None = None
    message: str = ""
    image_digest: str = ""  # the digest the agent pulled the image at (pin_digest)


def record_outcome(host: Host, instance_pk: int, outcome: Outcome) -> bool:
    """Apply what the agent of `host` reports of its allocation of the instance: `running`
    completes a start; `exited` stops the instance (reason exited), `failed` and `lost` fail
    it, billing closing at the agent's time. Answers whether it changed anything: a report
    about an allocation that is not the instance's current one on this host, or one already
    applied (the same event twice), changes nothing."""
    owned = Allocation.objects.filter(
        pk=outcome.allocation_id, instance_id=instance_pk, host=host, released_at__isnull=True
    ).exists()
    if not owned:
        return False
    if outcome.state == "running":
        return mark_running(
            instance_pk,
            outcome.allocation_id,
            outcome.message or "Running",
            at=outcome.at,
            image_digest=outcome.image_digest,
        )
    if outcome.state == "exited":
        return _workload_exited(instance_pk, outcome)
    if outcome.state in ("failed", "lost"):
        reason = reasons.from_agent(outcome.reason or reasons.Code.AGENT_REPORTED)
        if outcome.state == "lost":
            reason = reasons.Reason(reasons.Code.ALLOCATION_LOST, reason.text)
        never_ran = reason.code in NEVER_RAN
        at = outcome.at or timezone.now()
        with transaction.atomic():
            if not fail_instance(
                instance_pk,
                reason,
                allocation_id=outcome.allocation_id,
                at=at,
                only_states=WORKLOAD_STATES,
                exit_code=outcome.exit_code,
                never_ran=never_ran,
            ):
                return False
            if outcome.state == "failed":  # the workload's own failure, not its GPU's
                instance = locks.instance_to_change(instance_pk)
                restarts.schedule(
                    instance,
                    failed=True,
                    never_ran=never_ran,
                    why=reason.text,
                    at=_clamp(instance, at),
                )
        return True
    return False


def _workload_exited(instance_pk: int, outcome: Outcome) -> bool:
    """The workload ended by itself with exit code 0: stopping (billing closes at the exit),
    then the stop task takes the allocation off its host; the disk stays. Restart policy
    `always` then starts it again (restarts.schedule; a failure: record_outcome)."""
    with transaction.atomic():
        instance = locks.instance_to_change(instance_pk)
        if instance is None or instance.state not in WORKLOAD_STATES:
            return False
        current = instance.current_allocation()
        if current is None or current.pk != outcome.allocation_id:
            return False
        at = _clamp(instance, outcome.at)
        # it ended before the console saw it run (an unreachable one goes straight to
        # stopping: its billing stopped at its host's last heartbeat)
        if instance.state not in (S.RUNNING, S.UNREACHABLE):
            lifecycle.transition(instance, S.RUNNING, message="Running", at=at)
        instance.exit_code = outcome.exit_code or 0
        Instance.objects.filter(pk=instance.pk).update(exit_code=instance.exit_code)
        message = f"The workload exited with code {instance.exit_code}"
        if outcome.message:
            message += f": {outcome.message}"
        lifecycle.transition(
            instance, S.STOPPING, message=message, reason=reasons.Reason(reasons.Code.EXITED), at=at
        )
        queue.enqueue("stop", instance.pk)
        restarts.schedule(instance, failed=False, never_ran=False, why=message, at=at)
    return True


def record_progress(
    host: Host, instance_pk: int, allocation_id: str, message: str, pull: dict | None = None
) -> bool:
    """The agent is still starting the workload (pulling its image…): say so on the instance,
    in its events and in its tenant's browsers, without a transition. `pull`: the figures of
    an image pull's report (console/instances/pull_progress.py), kept with the reason."""
    with transaction.atomic():
        instance = locks.instance_to_change(instance_pk)
        if instance is None or instance.state not in (S.PROVISIONING, S.STARTING, S.REBOOTING):
            return False
        current = instance.current_allocation()
        if current is None or current.pk != allocation_id or current.host_id != host.pk:
            return False
        instance.set_reason(reasons.Reason(detail=message), pull=pull)
        last = instance.events.last()
        if last is not None and last.kind == "note" and _same_pull(last.message, message):
            # one event per pull, saying how far it got: a long pull reports every second
            InstanceEvent.objects.filter(pk=last.pk).update(message=reasons.shorten(message, 300))
            lifecycle.announce_unchanged(instance, timezone.now())
        else:
            lifecycle.announce_note(instance, message)
    return True


def _same_pull(earlier: str, message: str) -> bool:
    """Whether both are reports of the same image's pull (`pulling <reference>: 2 of 5 layers
    · 1.2 GB of 3.4 GB`, as the agent words them)."""
    return message.startswith("pulling ") and (
        earlier.partition(": ")[0] == message.partition(": ")[0]
    )


def note_retry(instance_pk: int, detail: str) -> None:
    """A host call is being retried: say so on the instance (no transition)."""
    reason = Instance.reason_fields(reasons.Reason(detail=detail))
    Instance.objects.filter(pk=instance_pk).update(**reason)
