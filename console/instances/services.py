"""Every change to an instance goes through one of these functions: one transaction, the
event rows (lifecycle.transition), and the Celery work queued after commit.

Locks are taken through the lock modules, in the order accounts/locks.py states: the
tenant's Quota row, then Instance rows, then the Host row, then its Gpu rows (placement).
Nothing that talks to a host runs inside a transaction: the Celery tasks in tasks.py read
what to do under a lock, call the agent, and come back here to record the outcome."""

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from accounts import locks as account_locks
from accounts.models import Quota, Tenant
from console.catalog.models import Image, Region, Spec, command_errors, env_errors
from console.celery import enqueue_on_commit
from console.errors import DomainError
from console.fleet import agent_client
from console.fleet.models import Host
from console.fleet.services import hosts_to_fail_over
from console.instances import access, availability, lifecycle, locks, placement
from console.instances.lifecycle import InvalidTransition
from console.instances.models import Allocation, Instance, State
from console.instances.quota import usage
from console.instances.signals import host_lost, launch_requested

log = logging.getLogger(__name__)

S = State
NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MAX_DISK_GIB = 65536  # 64 TiB: more is a typo, and would not fit the column
NAME_RULE = (
    "Use 1 to 63 lowercase letters, digits and hyphens, starting and ending with a letter or digit."
)


class InstanceError(DomainError):
    code = "conflict"


class QuotaExceeded(InstanceError):
    code = "quota_exceeded"


class InvalidState(InstanceError):
    code = "invalid_state"


class Busy(InstanceError):
    code = "busy"


def _enqueue(task: str, *args) -> None:
    """Queue ``console.instances.tasks.<task>`` once the current transaction commits."""
    enqueue_on_commit(f"console.instances.tasks.{task}", *args)


def kick_scheduler() -> None:
    """Capacity was released: let the queue move now rather than at the next beat."""
    _enqueue("schedule_pending")


# --- quota --------------------------------------------------------------------------------


def _lock_quota(tenant: Tenant) -> Quota:
    """Lock the tenant's quota row. The lock serialises every launch, start and resize of
    the tenant (on SQLite the IMMEDIATE transaction already does), so two of them can never
    both pass the check below. Taken first, before any instance row."""
    quota = account_locks.quota(tenant.pk)
    quota.tenant = tenant
    return quota


def _check_quota(quota: Quota, spec: Spec, exclude_instance_id: int | None = None) -> None:
    """One more instance of `spec` (instead of the excluded one) must fit in the quota."""
    tenant = quota.tenant
    used = usage(tenant, exclude_instance_id=exclude_instance_id)
    wanted = spec.gpu_equivalents
    if used.gpu_used + wanted > quota.gpu_quota:
        raise QuotaExceeded(
            f"{spec.code} needs {_num(wanted)} GPU; {tenant.name} already uses "
            f"{_num(used.gpu_used)} of its {_num(quota.gpu_quota)} GPU quota."
        )
    if used.instances_used + 1 > quota.max_instances:
        raise QuotaExceeded(
            f"{tenant.name} already has {used.instances_used} of its {quota.max_instances} "
            "instances running or queued."
        )


def _check_budget(tenant: Tenant) -> None:
    """Whoever listens may refuse (billing: a tenant that chose to stop at its monthly
    budget and spent it launches nothing new)."""
    launch_requested.send(sender=Tenant, tenant=tenant)


def _num(value) -> str:
    return f"{value.normalize():f}" if value else "0"


# --- locking and guards -------------------------------------------------------------------


def _lock(instance_pk: int, *, skip_locked: bool = False) -> Instance | None:
    return locks.instance(
        instance_pk, "spec__mig_profile", "region", "tenant", skip_locked=skip_locked
    )


def _lock_for(instance: Instance, action: str) -> Instance:
    locked = _lock(instance.pk)
    if locked is None:
        raise InvalidState("This instance no longer exists.")
    if locked.state not in lifecycle.ACTIONS[action]:
        raise InvalidState(f"Cannot {action} an instance that is {locked.state}.")
    return locked


def _waiting_reason(instance: Instance) -> str:
    host = instance.disk_host
    if not availability.can_ever_place(instance.spec, instance.region, host):
        detail = availability.hardware_detail(instance.spec, instance.region, host)
        return f"Can never be placed: {detail}"[:200]
    if host is not None:
        return (
            f"Waiting for {host.name}, which holds its disk: no {instance.spec.name} free "
            "there now."
        )
    return f"Waiting for capacity: no {instance.spec.name} free in {instance.region.name}."


def _place(instance: Instance, to_state: str, *, actor=None, message: str) -> str:
    """Try to give `instance` (locked) a slice now; on success move it to `to_state` and
    queue its provisioning. An instance that has a disk goes only to the host that holds it
    (a disk does not move between hosts). Answers "placed", "full" (nothing fits now) or
    "busy" (other workers kept taking the slices it chose: the scheduler tries again soon)."""
    try:
        allocation = placement.allocate(instance, instance.spec, host_pk=instance.disk_host_id)
    except placement.Busy as exc:
        log.info("%s", exc)
        kick_scheduler()
        return "busy"
    if allocation is None:
        return "full"
    lifecycle.transition(instance, to_state, actor=actor, message=message)
    _enqueue("provision", instance.pk)
    return "placed"


def _wait(instance: Instance) -> None:
    """Leave a pending instance waiting, saying why."""
    reason = _waiting_reason(instance)
    if instance.state_reason != reason:
        instance.state_reason = reason
        Instance.objects.filter(pk=instance.pk).update(state_reason=reason)


# --- what tenants do ----------------------------------------------------------------------


def default_region(spec: Spec) -> Region | None:
    """Where a launch without a region goes: a region where the spec fits now, else one
    that has GPUs of its model, else the first region."""
    regions = list(
        Region.objects.filter(hosts__gpus__model_id=spec.gpu_model_id).distinct().order_by("code")
    )
    if len(regions) == 1:
        return regions[0]
    for region in regions:
        if placement.fits_now(spec, placement.snapshot(region.pk)):
            return region
    return regions[0] if regions else Region.objects.order_by("code").first()


def validate_launch(
    tenant: Tenant,
    name: str,
    spec: Spec,
    image: Image,
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> None:
    errors = {}
    if command is not None:
        problems = command_errors(command) or ([] if command else ["Give at least one argument."])
        if problems:
            errors["command"] = problems
    if env is not None and (problems := env_errors(env)):
        errors["env"] = problems
    if not NAME_PATTERN.match(name or ""):
        errors["name"] = NAME_RULE
    elif Instance.objects.filter(tenant=tenant, name=name).exclude(state=S.TERMINATED).exists():
        errors["name"] = f"An instance named {name} already exists."
    if not spec.active:
        errors["spec"] = f"{spec.code} is retired and cannot be launched."
    if not image.active:
        errors["image"] = f"{image.name} is retired and cannot be launched."
    if errors:
        raise ValidationError(errors)


def launch_instance(
    tenant: Tenant,
    *,
    name: str,
    spec: Spec,
    image: Image,
    region: Region | None = None,
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
    ssh_keys: list[str] | None = None,
    ports: list[dict] | None = None,
    actor=None,
) -> Instance:
    """Accept a launch: within quota, it is placed at once when a slice is free (and goes on
    to provisioning) or waits in `pending` for the scheduler. `command` replaces the image's
    default command; `env` is laid over the image's default environment. `ssh_keys` names
    the keys that open its shells (default: all of the launching user's keys in the
    tenant; see access.launch_keys); `ports` adds web ports to the image's."""
    with transaction.atomic():
        quota = _lock_quota(tenant)  # first: it also serialises the name check below
        validate_launch(tenant, name, spec, image, command, env)
        keys = access.launch_keys(tenant, actor, ssh_keys)
        if ports and (problems := access.launch_ports_errors(image, ports)):
            raise ValidationError({"ports": problems})
        _check_quota(quota, spec)
        _check_budget(tenant)
        region = region or default_region(spec)
        if region is None:
            raise ValidationError({"region": "There is no region to launch in yet."})
        now = timezone.now()
        instance = Instance.objects.create(
            tenant=tenant,
            created_by=actor if getattr(actor, "pk", None) else None,
            name=name,
            spec=spec,
            image=image,
            region=region,
            command=command or None,
            env=env or {},
            disk_gib=spec.disk_gib,
            ports=ports or [],
            state=S.PENDING,
            created_at=now,
            updated_at=now,
        )
        instance.ssh_keys.set(keys)
        lifecycle.record_created(instance, actor=actor, message=f"Launch of {spec.name}")
        if _place(instance, S.PROVISIONING, actor=actor, message="GPU slice reserved") != "placed":
            _wait(instance)
    return instance


def stop_instance(instance: Instance, *, actor=None) -> Instance:
    """Stop: the slice goes back to the pool, the disk stays. A queued instance just stops
    waiting."""
    with transaction.atomic():
        instance = _lock_for(instance, "stop")
        if instance.state == S.PENDING:
            lifecycle.transition(instance, S.STOPPED, actor=actor, message="Stopped while queued")
        else:
            lifecycle.transition(instance, S.STOPPING, actor=actor, message="Stop requested")
            _enqueue("stop", instance.pk)
    return instance


def start_instance(instance: Instance, *, actor=None) -> Instance:
    """Start a stopped (or failed) instance: placed again, or queued when nothing fits."""
    with transaction.atomic():
        quota = _lock_quota(instance.tenant)
        if not Tenant.objects.filter(pk=instance.tenant_id, status=Tenant.Status.ACTIVE).exists():
            raise InvalidState(f"{instance.tenant.name} is suspended: its instances cannot start.")
        instance = _lock_for(instance, "start")
        _check_quota(quota, instance.spec, exclude_instance_id=instance.pk)
        _check_budget(instance.tenant)
        _forget_exit(instance)
        placed = _place(
            instance, S.STARTING, actor=actor, message="Start requested; GPU slice reserved"
        )
        if placed != "placed":
            lifecycle.transition(
                instance,
                S.PENDING,
                actor=actor,
                message="Start requested; waiting for capacity",
                reason=_waiting_reason(instance),
            )
    return instance


def reboot_instance(instance: Instance, *, actor=None) -> Instance:
    with transaction.atomic():
        instance = _lock_for(instance, "reboot")
        lifecycle.transition(instance, S.REBOOTING, actor=actor, message="Reboot requested")
        _enqueue("reboot", instance.pk)
    return instance


def terminate_instance(instance: Instance, *, actor=None) -> Instance:
    with transaction.atomic():
        instance = _lock_for(instance, "terminate")
        lifecycle.transition(instance, S.TERMINATING, actor=actor, message="Terminate requested")
        _enqueue("terminate", instance.pk)
    return instance


class NeedsStop(InstanceError):
    code = "needs_stop"


def _in_place_target(instance: Instance, spec: Spec) -> tuple[Allocation, list[int] | None] | None:
    """Where a resize of the running `instance` to `spec` could happen without a stop: its
    current allocation and (but for whole GPUs) the GPUs it holds; None when the GPU model
    or mode changes (a new placement, so a stop)."""
    old = instance.spec
    current = instance.current_allocation()
    if current is None or spec.mode != old.mode or spec.gpu_model_id != old.gpu_model_id:
        return None
    same_gpus = None
    if spec.mode != "whole":
        same_gpus = list(current.claims.values_list("gpu_id", flat=True).distinct())
    return current, same_gpus


def resize_stops(instance: Instance) -> Callable[[Spec], bool]:
    """Whether resizing `instance` to a spec now means stopping it (its GPU, or for whole
    GPUs its host, has no room for the spec, or the GPU model or mode changes), as a function
    of the spec that reads the instance's allocation and host once. Only a running instance
    is stopped by a resize."""
    if instance.state != S.RUNNING:
        return lambda spec: False
    current = instance.current_allocation()
    if current is None:
        return lambda spec: True
    old = instance.spec
    gpus = list(current.claims.values_list("gpu_id", flat=True).distinct())
    snap = placement.snapshot(
        instance.region_id, host_pks=[current.host_id], ignore_allocation_id=current.pk
    )

    def stops(spec: Spec) -> bool:
        if spec.mode != old.mode or spec.gpu_model_id != old.gpu_model_id:
            return True
        return placement.choose(spec, snap, None if spec.mode == "whole" else gpus) is None

    return stops


def validate_resize(instance: Instance, spec: Spec, disk_gib: int | None) -> None:
    """The field errors of a resize: a spec that is retired, the same, or that no host of
    the instance's region could hold; a disk smaller than the instance's."""
    errors = {}
    if not spec.active:
        errors["spec"] = f"{spec.code} is retired."
    elif spec.pk == instance.spec_id:
        errors["spec"] = f"The instance already is a {spec.code}."
    elif not availability.can_ever_place(spec, instance.region, instance.disk_host):
        errors["spec"] = availability.hardware_detail(spec, instance.region, instance.disk_host)
    if disk_gib is not None and disk_gib < instance.disk_gib:
        errors["disk_gib"] = (
            f"A disk never shrinks: it is {instance.disk_gib} GiB; give {instance.disk_gib} "
            "or more."
        )
    elif disk_gib is not None and disk_gib > MAX_DISK_GIB:
        errors["disk_gib"] = f"At most {MAX_DISK_GIB} GiB."
    if errors:
        raise ValidationError(errors)


def resize_instance(
    instance: Instance,
    spec: Spec,
    *,
    disk_gib: int | None = None,
    allow_stop: bool = True,
    actor=None,
) -> Instance:
    """Change the spec. Quota first; a running instance is resized in place when its GPU
    (for whole GPUs: its host) has room, else (when `allow_stop`; NeedsStop otherwise)
    stopped, placed again and started. The disk stays as it is, or grows to `disk_gib`;
    never shrinks, and the spec's own disk size does not matter after the launch."""
    with transaction.atomic():
        quota = _lock_quota(instance.tenant)
        instance = _lock_for(instance, "resize")
        validate_resize(instance, spec, disk_gib)
        old = instance.spec
        if instance.state != S.STOPPED:  # a stopped instance is checked when it starts
            _check_quota(quota, spec, exclude_instance_id=instance.pk)
            if spec.current_price() > old.current_price():
                _check_budget(instance.tenant)
        message = f"Resize from {old.code} to {spec.code}"
        changes = {"spec": spec}
        if disk_gib is not None and disk_gib > instance.disk_gib:
            message += f", disk {instance.disk_gib} → {disk_gib} GiB"
            changes["disk_gib"] = disk_gib
        if instance.state == S.STOPPED:
            Instance.objects.filter(pk=instance.pk).update(**changes, updated_at=timezone.now())
            for name, value in changes.items():
                setattr(instance, name, value)
            lifecycle.note(instance, message, actor=actor)
            return instance
        target = _in_place_target(instance, spec)
        allocation = None
        if target is not None:
            current, same_gpus = target
            try:
                allocation = placement.allocate(
                    instance, spec, host_pk=current.host_id, gpu_pks=same_gpus, replacing=current
                )
            except placement.Busy as exc:
                raise Busy("Its GPU is busy with other placements; try again.") from exc
        if allocation is None and not allow_stop:
            raise NeedsStop(
                f"{spec.name} does not fit on the GPU {instance.name} runs on now: the resize "
                f"stops it, then starts it again as {spec.name} (queued if nothing is free)."
            )
        for name, value in changes.items():
            setattr(instance, name, value)
        if allocation is not None:
            Instance.objects.filter(pk=instance.pk).update(**changes)
            lifecycle.transition(instance, S.REBOOTING, actor=actor, message=f"{message}, in place")
            _enqueue("resize", instance.pk, current.pk)
        else:
            instance.resume_after_stop = True
            Instance.objects.filter(pk=instance.pk).update(**changes, resume_after_stop=True)
            lifecycle.transition(
                instance,
                S.STOPPING,
                actor=actor,
                message=f"{message}: no room on its GPU, stopping to place it again",
            )
            _enqueue("stop", instance.pk)
    return instance


# --- what the workers record --------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """What a task has to do on a host, read under the instance's lock."""

    instance_pk: int
    state: str
    allocation_id: str | None
    host: Host | None
    request: dict


def job(instance_pk: int, states: tuple[str, ...]) -> Job | None:
    """The instance's current allocation if the instance is in one of `states`, else None
    (the task was redelivered, or the instance moved on: nothing to do).

    A plain read, no lock: nothing is written here (on SQLite a transaction would take the
    database's write lock), and whatever the task does next is recorded by a function that
    checks the state again under the lock (mark_running, finish_stop, ...)."""
    instance = Instance.objects.filter(pk=instance_pk).only("pk", "state").first()
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
    )


def mark_running(instance_pk: int, allocation_id: str, message: str = "Running") -> bool:
    """The agent runs the allocation: provisioning/starting/rebooting → running."""
    with transaction.atomic():
        instance = _lock(instance_pk)
        if instance is None or instance.state not in (S.PROVISIONING, S.STARTING, S.REBOOTING):
            return False
        allocation = instance.current_allocation()
        if allocation is None or allocation.pk != allocation_id:
            return False
        lifecycle.transition(instance, S.RUNNING, message=message)
    return True


def finish_stop(instance_pk: int) -> bool:
    """The agent let go of the slice: release it; stopped (and, for a resize, start again)."""
    with transaction.atomic():
        instance = _lock(instance_pk)
        if instance is None or instance.state != S.STOPPING:
            return False
        _stop_here(instance, message="Stopped; GPU slice released")
    return True


def _stop_here(instance: Instance, message: str) -> None:
    for allocation in instance.allocations.filter(released_at__isnull=True):
        placement.release(allocation)
    resume = instance.resume_after_stop
    if resume:
        instance.resume_after_stop = False
        Instance.objects.filter(pk=instance.pk).update(resume_after_stop=False)
    # A workload that exited by itself stays stopped with that reason.
    reason = instance.state_reason if instance.exit_code is not None else None
    lifecycle.transition(instance, S.STOPPED, message=message, reason=reason)
    if (
        resume
        and _place(instance, S.STARTING, message=f"Starting again as {instance.spec.code}")
        != "placed"
    ):
        lifecycle.transition(
            instance,
            S.PENDING,
            message=f"Waiting for capacity to start again as {instance.spec.code}",
            reason=_waiting_reason(instance),
        )
    kick_scheduler()


def finish_terminate(instance_pk: int, message: str = "Terminated") -> bool:
    with transaction.atomic():
        instance = _lock(instance_pk)
        if instance is None or instance.state != S.TERMINATING:
            return False
        _terminate_here(instance, message)
    return True


def _terminate_here(instance: Instance, message: str) -> None:
    for allocation in instance.allocations.filter(released_at__isnull=True):
        placement.release(allocation)
    if instance.resume_after_stop:
        Instance.objects.filter(pk=instance.pk).update(resume_after_stop=False)
    lifecycle.transition(instance, S.TERMINATED, message=message)
    kick_scheduler()


def disk_to_delete(instance_pk: int) -> Host | None:
    """The host that holds a terminating instance's disk (and kept logs), if it has one."""
    instance = Instance.objects.select_related("disk_host").filter(pk=instance_pk).first()
    return instance.disk_host if instance is not None else None


def allocations_to_tear_down(instance_pk: int) -> list[Allocation]:
    """Every allocation of a terminating instance that may still exist on a host."""
    return list(
        Allocation.objects.filter(instance_id=instance_pk, released_at__isnull=True).select_related(
            "host"
        )
    )


def fail_instance(
    instance_pk: int,
    reason: str,
    *,
    allocation_id: str | None = None,
    at: datetime | None = None,
    only_states: tuple[str, ...] | None = None,
    exit_code: int | None = None,
) -> bool:
    """Something went wrong on the host side: failed, with the reason (and the workload's
    exit code, when it ended by itself), and its slice freed (the agent's copy, if any, is
    torn down by reconcile). With `allocation_id`, only if that is still the instance's
    current allocation."""
    with transaction.atomic():
        instance = _lock(instance_pk)
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
        at = _clamp(instance, at) if at is not None else None
        lifecycle.transition(instance, S.FAILED, message=reason, reason=reason, at=at)
        kick_scheduler()
    return True


def _clamp(instance: Instance, at: datetime | None) -> datetime:
    """The time an agent gives for an outcome, not later than now and not earlier than the
    instance's last event (billing closes there)."""
    now = timezone.now()
    at = min(at or now, now)
    last = instance.events.order_by("-at").values_list("at", flat=True).first()
    return max(at, last) if last is not None else at


def _forget_exit(instance: Instance) -> None:
    """A new run of the workload: how the last one ended is history (its events keep it)."""
    if instance.exit_code is not None:
        instance.exit_code = None
        Instance.objects.filter(pk=instance.pk).update(exit_code=None)


# --- what the agents report ---------------------------------------------------------------

# States in which the workload of the current allocation is (being) run by its agent.
WORKLOAD_STATES = (S.PROVISIONING, S.STARTING, S.REBOOTING, S.RUNNING)
ENDED = ("exited", "failed", "lost")


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
        return mark_running(instance_pk, outcome.allocation_id, outcome.message or "Running")
    if outcome.state == "exited":
        return _workload_exited(instance_pk, outcome)
    if outcome.state in ("failed", "lost"):
        reason = outcome.reason or "reported by the agent"
        if outcome.state == "lost":
            reason = f"allocation_lost: {reason}"
        return fail_instance(
            instance_pk,
            reason,
            allocation_id=outcome.allocation_id,
            at=outcome.at or timezone.now(),
            only_states=WORKLOAD_STATES,
            exit_code=outcome.exit_code,
        )
    return False


def _workload_exited(instance_pk: int, outcome: Outcome) -> bool:
    """The workload ended by itself with exit code 0: stopping (billing closes at the exit),
    then the stop task takes the allocation off its host; the disk stays."""
    with transaction.atomic():
        instance = _lock(instance_pk)
        if instance is None or instance.state not in WORKLOAD_STATES:
            return False
        current = instance.current_allocation()
        if current is None or current.pk != outcome.allocation_id:
            return False
        at = _clamp(instance, outcome.at)
        if instance.state != S.RUNNING:  # it ended before the console saw it run
            lifecycle.transition(instance, S.RUNNING, message="Running", at=at)
        instance.exit_code = outcome.exit_code or 0
        Instance.objects.filter(pk=instance.pk).update(exit_code=instance.exit_code)
        message = f"The workload exited with code {instance.exit_code}"
        if outcome.message:
            message += f": {outcome.message}"
        lifecycle.transition(instance, S.STOPPING, message=message, reason="exited", at=at)
        _enqueue("stop", instance.pk)
    return True


def record_progress(host: Host, instance_pk: int, allocation_id: str, message: str) -> bool:
    """The agent is still starting the workload (pulling its image…): say so on the instance,
    in its events and in its tenant's browsers, without a transition."""
    with transaction.atomic():
        instance = _lock(instance_pk)
        if instance is None or instance.state not in (S.PROVISIONING, S.STARTING, S.REBOOTING):
            return False
        current = instance.current_allocation()
        if current is None or current.pk != allocation_id or current.host_id != host.pk:
            return False
        instance.state_reason = message[:200]
        Instance.objects.filter(pk=instance.pk).update(state_reason=instance.state_reason)
        lifecycle.announce_note(instance, message)  # "pulling …: 1.2 GB of 3.4 GB"
    return True


class LogsUnavailable(InstanceError):
    code = "host_unavailable"


def instance_logs(instance: Instance, tail: int) -> list[str]:
    """The last `tail` lines its workload wrote (this run's and earlier ones'), from the host
    that holds its disk; none before it was ever placed. LogsUnavailable when that host does
    not answer."""
    host = instance.disk_host
    if host is None:
        return []
    if host.status == Host.Status.UNREACHABLE:
        raise LogsUnavailable(f"{host.name}, which holds its logs, is not answering.")
    try:
        return agent_client.instance_logs(host, instance.pk, tail)
    except agent_client.AgentError as exc:
        raise LogsUnavailable(f"{host.name} could not give its logs: {exc.message}") from exc


def note_retry(instance_pk: int, detail: str) -> None:
    """A host call is being retried: say so on the instance (no transition)."""
    Instance.objects.filter(pk=instance_pk).update(state_reason=detail[:200])


def place_pending(instance_pk: int) -> str | None:
    """Give one queued instance a slice if one is free: "placed", "full" or "busy" (see
    _place); None when it is not pending (any more) or another worker holds it."""
    with transaction.atomic():
        instance = _lock(instance_pk, skip_locked=True)
        if instance is None or instance.state != S.PENDING:
            return None
        outcome = _place(instance, S.PROVISIONING, message="GPU slice reserved")
        if outcome == "full":
            _wait(instance)
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
        if outcome == "placed":
            placed += 1
        elif outcome == "full":
            blocked.add(tuple(where))
    return placed


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
        instance = _lock(instance_pk)
        if instance is None:
            return False
        current = instance.current_allocation()
        if current is None or current.pk != allocation_id:
            # a released allocation that reconcile will tear down; nothing to do here
            return False
        host_lost.send(sender=Instance, instance=instance, at=at)
        detail = f"{HOST_UNREACHABLE}: host stopped answering at {at:%Y-%m-%d %H:%M:%S} UTC"
        if instance.state == S.STOPPING:
            _stop_here(instance, message=f"Stopped; {detail}")
            return True
        if instance.state == S.TERMINATING:
            _terminate_here(instance, message=f"Terminated; {detail}")
            return True
    return fail_instance(instance_pk, HOST_UNREACHABLE, allocation_id=allocation_id, at=at)


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
            _enqueue(STUCK_TASKS[state], pk)
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
    _enqueue("provision", instance.pk)
    return True


__all__ = [
    "Busy",
    "InstanceError",
    "InvalidState",
    "InvalidTransition",
    "NeedsStop",
    "QuotaExceeded",
    "launch_instance",
    "stop_instance",
    "start_instance",
    "reboot_instance",
    "resize_instance",
    "terminate_instance",
]
