"""What tenants do to instances (the pages, the API and billing's budget call these): launch,
stop, start, reboot, resize, terminate, read the logs. Each is one transaction, the event
rows (lifecycle.transition), and the Celery work queued after commit (queue.enqueue).

The rest of an instance's life is in the modules named for who calls them: queue.py (the
pending queue), outcomes.py (what the tasks and the agents record), recovery.py (failover
and reconcile). Locks are taken through locks.py, in the order accounts/locks.py states.
Nothing that talks to a host runs inside a transaction: the Celery tasks in tasks.py read
what to do, call the agent, and record the outcome through outcomes.py."""

import logging
import re
from collections.abc import Callable

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from accounts import locks as account_locks
from accounts.models import Quota, Tenant
from console.catalog.models import Image, Region, Spec, command_errors, env_errors
from console.errors import DomainError
from console.fleet import agent_client
from console.fleet.models import Host
from console.instances import access, availability, lifecycle, locks, placement, queue
from console.instances.lifecycle import InvalidTransition
from console.instances.models import Allocation, Instance, OnHostLoss, State
from console.instances.quota import usage
from console.instances.signals import launch_requested

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


def _check_active(instance: Instance, action: str) -> None:
    """A suspended tenant's instances neither start nor resize (a resize may start one)."""
    if not Tenant.objects.filter(pk=instance.tenant_id, status=Tenant.Status.ACTIVE).exists():
        raise InvalidState(f"{instance.tenant.name} is suspended: its instances cannot {action}.")


def _lock_for(instance: Instance, action: str) -> Instance:
    locked = locks.instance_to_change(instance.pk)
    if locked is None:
        raise InvalidState("This instance no longer exists.")
    if locked.state not in lifecycle.ACTIONS[action]:
        raise InvalidState(f"Cannot {action} an instance that is {locked.state}.")
    return locked


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
    elif _name_taken(tenant, name):
        errors["name"] = _name_taken_message(name)
    if not spec.active:
        errors["spec"] = f"{spec.code} is retired and cannot be launched."
    if not image.active:
        errors["image"] = f"{image.name} is retired and cannot be launched."
    if errors:
        raise ValidationError(errors)


def _name_taken(tenant: Tenant, name: str) -> bool:
    return Instance.objects.filter(tenant=tenant, name=name).exclude(state=S.TERMINATED).exists()


def _name_taken_message(name: str) -> str:
    return f"An instance named {name} already exists."


def _check_name_free(tenant: Tenant, name: str) -> None:
    """The name again, under the quota lock: of two launches with one name, only one passes."""
    if _name_taken(tenant, name):
        raise ValidationError({"name": _name_taken_message(name)})


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
    restart_policy: str | None = None,
    on_host_loss: str = OnHostLoss.KEEP_DISK,
    actor=None,
) -> Instance:
    """Accept a launch: within quota, it is placed at once when a slice is free (and goes on
    to provisioning) or waits in `pending` for the scheduler. `command` replaces the image's
    default command; `env` is laid over the image's default environment. `ssh_keys` names
    the keys that open its shells (default: all of the launching user's keys in the
    tenant; see access.launch_keys); `ports` adds web ports to the image's. `restart_policy`
    (default: the image's) and `on_host_loss` say what it does when its host is lost
    (recovery.fail_over_hosts).

    What needs no lock is checked first: the request's own fields, the region, whether its
    hardware could ever hold the spec. The transaction (on SQLite the database's one write
    lock, which every launch, task and agent event waits for) holds only what must be
    decided together with the other launches: the name, the quota, the budget, the slice."""
    validate_launch(tenant, name, spec, image, command, env)
    if ports and (problems := access.launch_ports_errors(image, ports)):
        raise ValidationError({"ports": problems})
    region = region or default_region(spec)
    if region is None:
        raise ValidationError({"region": "There is no region to launch in yet."})
    if not availability.can_ever_place(spec, region):
        detail = availability.hardware_detail(spec, region)
        raise ValidationError({"spec": f"{spec.name} cannot be launched: {detail}"})
    with transaction.atomic():
        quota = _lock_quota(tenant)  # first: it also serialises the name check below
        _check_name_free(tenant, name)
        keys = access.launch_keys(tenant, actor, ssh_keys)
        _check_quota(quota, spec)
        _check_budget(tenant)
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
            restart_policy=restart_policy or image.restart_policy,
            on_host_loss=on_host_loss,
            state=S.PENDING,
            created_at=now,
            updated_at=now,
        )
        instance.ssh_keys.add(*keys)  # a new instance: nothing to replace
        lifecycle.record_created(instance, actor=actor, message=f"Launch of {spec.name}")
        if (
            queue.place(instance, S.PROVISIONING, actor=actor, message="GPU slice reserved")
            != "placed"
        ):
            queue.wait(instance)
    return instance


def stop_instance(instance: Instance, *, actor=None) -> Instance:
    """Stop: the slice goes back to the pool, the disk stays. A queued instance just stops
    waiting; one that waits for a restart (restarts.schedule) is not restarted."""
    with transaction.atomic():
        locked = locks.instance_to_change(instance.pk)
        if locked is not None and lifecycle.waits_for_restart(locked.state, locked.restart_at):
            locked.restart_at = None
            Instance.objects.filter(pk=locked.pk).update(restart_at=None)
            lifecycle.announce_note(locked, "Stop requested: not restarted", actor=actor)
            return locked
        instance = _lock_for(instance, "stop")
        if instance.state == S.PENDING:
            lifecycle.transition(instance, S.STOPPED, actor=actor, message="Stopped while queued")
        else:
            lifecycle.transition(instance, S.STOPPING, actor=actor, message="Stop requested")
            queue.enqueue("stop", instance.pk)
    return instance


def start_instance(instance: Instance, *, actor=None, message: str = "Start requested") -> Instance:
    """Start a stopped (or failed) instance: placed again, or queued when nothing fits.
    `message` begins its event (a restart says which)."""
    with transaction.atomic():
        quota = _lock_quota(instance.tenant)
        _check_active(instance, "start")
        instance = _lock_for(instance, "start")
        _check_quota(quota, instance.spec, exclude_instance_id=instance.pk)
        _check_budget(instance.tenant)
        _forget_exit(instance)
        placed = queue.place(
            instance, S.STARTING, actor=actor, message=f"{message}; GPU slice reserved"
        )
        if placed != "placed":
            lifecycle.transition(
                instance,
                S.PENDING,
                actor=actor,
                message=f"{message}; waiting for capacity",
                reason=queue.waiting_reason(instance),
            )
    return instance


def reboot_instance(instance: Instance, *, actor=None) -> Instance:
    with transaction.atomic():
        instance = _lock_for(instance, "reboot")
        lifecycle.transition(instance, S.REBOOTING, actor=actor, message="Reboot requested")
        queue.enqueue("reboot", instance.pk)
    return instance


def terminate_instance(instance: Instance, *, actor=None) -> Instance:
    with transaction.atomic():
        instance = _lock_for(instance, "terminate")
        lifecycle.transition(instance, S.TERMINATING, actor=actor, message="Terminate requested")
        queue.enqueue("terminate", instance.pk)
    return instance


def _forget_exit(instance: Instance) -> None:
    """A new run of the workload: how the last one ended is history (its events keep it),
    and a restart it waited for is this start."""
    if instance.exit_code is not None or instance.restart_at is not None:
        instance.exit_code = instance.restart_at = None
        Instance.objects.filter(pk=instance.pk).update(exit_code=None, restart_at=None)


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
        _check_active(instance, "resize")
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
            queue.enqueue("resize", instance.pk, current.pk)
        else:
            instance.resume_after_stop = True
            Instance.objects.filter(pk=instance.pk).update(**changes, resume_after_stop=True)
            lifecycle.transition(
                instance,
                S.STOPPING,
                actor=actor,
                message=f"{message}: no room on its GPU, stopping to place it again",
            )
            queue.enqueue("stop", instance.pk)
    return instance


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
