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
from collections.abc import Callable, Iterable

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from accounts import locks as account_locks
from accounts.models import Quota, Tenant
from console import secret_env
from console.audit import recorder as audit
from console.catalog import registries
from console.catalog.models import (
    Image,
    Region,
    RestartPolicy,
    Spec,
    command_errors,
    env_errors,
)
from console.errors import DomainError, ErrorCode
from console.fleet import agent_client, image_availability
from console.fleet.models import Host
from console.instances import (
    access,
    availability,
    hooks,
    lifecycle,
    locks,
    names,
    placement,
    queue,
    reasons,
    resizing,
    signals,
)
from console.instances.lifecycle import InvalidTransition
from console.instances.models import Instance, OnHostLoss, State
from console.instances.quota import usage

log = logging.getLogger(__name__)

S = State
NAME_PATTERN = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
MAX_DISK_GIB = 65536  # 64 TiB: more is a typo, and would not fit the column
NAME_RULE = (
    "Use 1 to 63 lowercase letters, digits and hyphens, starting and ending with a letter or digit."
)


class InstanceError(DomainError):
    code = ErrorCode.CONFLICT


class QuotaExceeded(InstanceError):
    code = ErrorCode.QUOTA_EXCEEDED


class InvalidState(InstanceError):
    code = ErrorCode.INVALID_STATE


class Busy(InstanceError):
    code = ErrorCode.BUSY


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
    image: Image | None,
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
    disk_gib: int | None = None,
    secrets: dict[str, str] | None = None,
) -> None:
    errors = {}
    if disk_gib is not None and not spec.disk_gib <= disk_gib <= MAX_DISK_GIB:
        errors["disk_gib"] = (
            f"{spec.code} comes with {spec.disk_gib} GiB: give {spec.disk_gib} to "
            f"{MAX_DISK_GIB} GiB."
        )
    if command is not None:
        problems = command_errors(command) or ([] if command else ["Give at least one argument."])
        if problems:
            errors["command"] = problems
    if env is not None and (problems := env_errors(env)):
        errors["env"] = problems
    if secrets and (problems := env_errors(secrets) or secret_env.errors(secrets, env or {})):
        errors["secret_env"] = problems
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        errors["name"] = NAME_RULE
    elif _name_taken(tenant, name):
        errors["name"] = _name_taken_message(name)
    if not spec.active:
        errors["spec"] = f"{spec.code} is retired and cannot be launched."
    if image is not None and not image.active:
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


def default_image() -> Image | None:
    """The image of a launch that names none (the form preselects it too): the first active
    one by name."""
    return Image.objects.filter(active=True).order_by("name").first()


def check_image_obtainable(image: Image | None, region: Region, image_ref: str = "") -> None:
    """A field error when no host of `region` can obtain the launch's image (the tenant's
    `image_ref`, else the catalog's `image`): its registry is out of every host's reach, or
    it is a local image no host holds (console/fleet/image_availability.py). Rather refused
    now, with the reason, than failed on a host after a wait."""
    if image_ref:
        field, name, reference = "image_ref", image_ref, image_ref
    elif image is not None:
        field, name, reference = "image", image.name, image.reference
    else:
        return
    found = image_availability.classify(region, reference)
    if not found.launchable:
        raise ValidationError({field: f"{name} cannot run in {region.name}: {found.detail}"})


def launch_instance(
    tenant: Tenant,
    *,
    name: str | None = None,
    spec: Spec,
    image: Image | None = None,
    image_ref: str | None = None,
    region: Region | None = None,
    disk_gib: int | None = None,
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
    secrets: dict[str, str] | None = None,
    ssh_keys: list[str] | None = None,
    ports: list[dict] | None = None,
    restart_policy: str | None = None,
    on_host_loss: str = OnHostLoss.KEEP_DISK,
    volumes: list[dict] | None = None,
    actor=None,
) -> Instance:
    """Accept a launch: within quota, it is placed at once when a slice is free (and goes on
    to provisioning) or waits in `pending` for the scheduler. `command` replaces the image's
    default command; `env` is laid over the image's default environment, and `secrets` (in
    clear; with the env names that look like credentials, secret_env.split) are sealed and
    go to the container only (secret_env.py). `ssh_keys` names
    the keys that open its shells (default: all of the launching user's keys in the
    tenant; see access.launch_keys); `ports` adds web ports to the image's. `restart_policy`
    (default: the image's) and `on_host_loss` say what it does when its host is lost
    (recovery.fail_over_hosts). Without a `name` it gets a generated one (names.generate),
    without an `image` the default one, without `disk_gib` the spec's disk (a bigger one may
    be asked for). `image_ref`, instead of `image`, runs a reference of the tenant's own where
    the region allows it (catalog/registries.py), with the image's own command, environment
    and ports; its first pull pins it to a digest (outcomes.pin_digest).

    What needs no lock is checked first: the request's own fields, the region, whether its
    hardware could ever hold the spec. The transaction (on SQLite the database's one write
    lock, which every launch, task and agent event waits for) holds only what must be
    decided together with the other launches: the name, the quota, the budget, the slice."""
    if image is not None and image_ref:
        raise ValidationError(
            {"image_ref": "Give a catalog image or an image reference, not both."}
        )
    if not image_ref:
        image = image or default_image()
        if image is None:
            raise ValidationError({"image": "The catalog has no image to launch yet."})
    name = name or names.generate(spec.code, lambda candidate: _name_taken(tenant, candidate))
    env, secrets = secret_env.split(env or {}, secrets or {})
    validate_launch(tenant, name, spec, image, command, env, disk_gib, secrets)
    if ports and (problems := access.launch_ports_errors(image, ports)):
        raise ValidationError({"ports": problems})
    region = region or default_region(spec)
    if region is None:
        raise ValidationError({"region": "There is no region to launch in yet."})
    if image_ref and (refused := registries.refusal(image_ref, region)):
        raise ValidationError({"image_ref": refused})
    if not availability.can_ever_place(spec, region):
        detail = availability.hardware_detail(spec, region)
        quota = Quota.objects.filter(tenant_id=tenant.pk).first()
        over_quota = availability.quota_detail(spec, quota) if quota else ""
        raise ValidationError(
            {"spec": f"{spec.name} cannot be launched: {detail} {over_quota}".strip()}
        )
    check_image_obtainable(image, region, image_ref or "")
    with transaction.atomic():
        quota = _lock_quota(tenant)  # first: it also serialises the name check below
        _check_name_free(tenant, name)
        keys = access.launch_keys(tenant, actor, ssh_keys)
        _check_quota(quota, spec)
        hooks.check_launch(tenant)
        now = timezone.now()
        instance = Instance.objects.create(
            tenant=tenant,
            created_by=actor if getattr(actor, "pk", None) else None,
            name=name,
            spec=spec,
            image=image,
            image_reference=image_ref or "",
            region=region,
            command=command or None,
            env=env,
            secret_env=secret_env.seal(secrets),
            disk_gib=disk_gib or spec.disk_gib,
            ports=ports or [],
            restart_policy=restart_policy
            or (image.restart_policy if image is not None else RestartPolicy.ON_FAILURE),
            on_host_loss=on_host_loss,
            state=S.PENDING,
            created_at=now,
            updated_at=now,
        )
        instance.ssh_keys.add(*keys)  # a new instance: nothing to replace
        lifecycle.record_created(instance, actor=actor, message=f"Launch of {spec.name}")
        signals.launching.send(sender=Instance, instance=instance, volumes=volumes or [])
        if (
            queue.place(instance, S.PROVISIONING, actor=actor, message="GPU slice reserved")
            != queue.Placement.PLACED
        ):
            queue.wait(instance)
        audit.record("instance.launch", instance, after=_launched(instance))
    return instance


def stop_instance(
    instance: Instance, *, actor=None, reason: reasons.Reason | None = None
) -> Instance:
    """Stop: the slice goes back to the pool, the disk stays. A queued instance just stops
    waiting; one that waits for a restart (restarts.schedule) is not restarted. `reason` (a
    state reason code with its detail, see reasons.py: billing's budget stop, the idle
    watch's) is said in the event and stays the stopped instance's reason."""
    said = reasons.explain(reason)
    with transaction.atomic():
        locked = locks.instance_to_change(instance.pk)
        if locked is not None and lifecycle.waits_for_restart(locked.state, locked.restart_at):
            locked.restart_at = None
            Instance.objects.filter(pk=locked.pk).update(restart_at=None)
            note = f"Not restarted: {said}" if said else "Stop requested: not restarted"
            lifecycle.announce_note(locked, note, actor=actor)
            audit.record("instance.stop", locked, before={"restart": "due"}, after={"restart": ""})
            return locked
        instance = _lock_for(instance, "stop")
        if instance.state == S.PENDING:
            lifecycle.transition(
                instance,
                S.STOPPED,
                actor=actor,
                message=said or "Stopped while queued",
                reason=reason,
            )
        else:
            lifecycle.transition(
                instance, S.STOPPING, actor=actor, message=said or "Stop requested", reason=reason
            )
            queue.enqueue("stop", instance.pk)
        audit.record("instance.stop", instance, before=_was(locked), after=_was(instance))
    return instance


def stop_all(tenant: Tenant, states: Iterable[str], stop: Callable[[Instance], bool]) -> int:
    """Stop every instance of ``tenant`` in ``states``, in pk order (the lock order), with
    ``stop`` (one transaction each), which answers whether it changed anything: the tenant's
    suspension and billing's budget stop. Answers how many changed."""
    instances = Instance.objects.filter(tenant=tenant, state__in=states).order_by("pk")
    return sum(stop(instance) for instance in instances)


def start_instance(
    instance: Instance, *, actor=None, message: str = "Start requested", new_run: bool = True
) -> Instance:
    """Start a stopped (or failed) instance: placed again, or queued when nothing fits.
    `message` begins its event (a restart says which); `new_run`: the tenant asked for it,
    so billing begins a new run (a restart of the restart policy goes on with the run)."""
    with transaction.atomic():
        quota = _lock_quota(instance.tenant)
        _check_active(instance, "start")
        instance = _lock_for(instance, "start")
        was = _was(instance)
        _check_quota(quota, instance.spec, exclude_instance_id=instance.pk)
        hooks.check_launch(instance.tenant)
        _forget_exit(instance)
        placed = queue.place(
            instance,
            S.STARTING,
            actor=actor,
            message=f"{message}; GPU slice reserved",
            continues_run=not new_run,
        )
        if placed != queue.Placement.PLACED:
            lifecycle.transition(
                instance,
                S.PENDING,
                actor=actor,
                message=f"{message}; waiting for capacity",
                reason=queue.waiting_reason(instance),
                continues_run=not new_run,
            )
        audit.record("instance.start", instance, before=was, after=_was(instance))
    return instance


def reboot_instance(instance: Instance, *, actor=None) -> Instance:
    with transaction.atomic():
        instance = _lock_for(instance, "reboot")
        was = _was(instance)
        lifecycle.transition(instance, S.REBOOTING, actor=actor, message="Reboot requested")
        queue.enqueue("reboot", instance.pk)
        audit.record("instance.reboot", instance, before=was, after=_was(instance))
    return instance


def terminate_instance(instance: Instance, *, keep_disk: bool = False, actor=None) -> Instance:
    """Terminate: its volumes are detached; its own disk is deleted, or with `keep_disk` kept
    as a volume of the tenant (signals.terminating)."""
    with transaction.atomic():
        instance = _lock_for(instance, "terminate")
        was = _was(instance)
        signals.terminating.send(
            sender=Instance, instance=instance, keep_disk=keep_disk, actor=actor
        )
        lifecycle.transition(instance, S.TERMINATING, actor=actor, message="Terminate requested")
        queue.enqueue("terminate", instance.pk)
        audit.record("instance.terminate", instance, before=was, after=_was(instance))
    return instance


def _launched(instance: Instance) -> dict:
    """What the audit log keeps of a launch."""
    return {
        "name": instance.name,
        "spec": instance.spec.code,
        "image": instance.image_label,
        "region": instance.region.code,
        "disk_gib": instance.disk_gib,
        "state": instance.state,
    }


def _was(instance: Instance) -> dict:
    """What the audit log keeps of an instance's lifecycle: its state."""
    return {"state": instance.state}


def _forget_exit(instance: Instance) -> None:
    """A new run of the workload: how the last one ended is history (its events keep it),
    and a restart it waited for is this start."""
    if instance.exit_code is not None or instance.restart_at is not None:
        instance.exit_code = instance.restart_at = None
        Instance.objects.filter(pk=instance.pk).update(exit_code=None, restart_at=None)


class NeedsConsent(ValidationError):
    """A resize that restarts or stops a running instance, not allowed by the caller: a field
    error on the flag that allows it (allow_restart, allow_stop); `impact` says which."""

    def __init__(self, impact: str, message: str):
        super().__init__({resizing.CONSENT[impact]: message})
        self.impact = impact
        self.detail = message


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
    allow_restart: bool = False,
    allow_stop: bool = False,
    actor=None,
) -> Instance:
    """Change the spec. Quota first; then, for a running instance, what resizing.impacts
    decides: its limits change live (nothing restarts), or, when `allow_restart`, it restarts
    on its GPU as the new spec, or, when `allow_stop`, it is stopped, placed again and
    started; NeedsConsent when the flag is not given. The disk stays as it is, or grows to
    `disk_gib`; never shrinks, and the spec's own disk size does not matter after the launch."""
    with transaction.atomic():
        quota = _lock_quota(instance.tenant)
        _check_active(instance, "resize")
        instance = _lock_for(instance, "resize")
        validate_resize(instance, spec, disk_gib)
        old = instance.spec
        if instance.state != S.STOPPED:  # a stopped instance is checked when it starts
            _check_quota(quota, spec, exclude_instance_id=instance.pk)
            if spec.current_price() > old.current_price():
                hooks.check_launch(instance.tenant)
        message = f"Resize from {old.code} to {spec.code}"
        changes = {"spec": spec}
        if disk_gib is not None and disk_gib > instance.disk_gib:
            message += f", disk {instance.disk_gib} → {disk_gib} GiB"
            changes["disk_gib"] = disk_gib
        audit.record(
            "instance.resize",
            instance,
            before={"spec": old.code, "disk_gib": instance.disk_gib},
            after={"spec": spec.code, "disk_gib": changes.get("disk_gib", instance.disk_gib)},
        )
        impact = resizing.impacts(instance)(spec, "disk_gib" in changes)
        allowed = {resizing.RESTART: allow_restart, resizing.STOP: allow_stop}
        if not allowed.get(impact, True):
            raise NeedsConsent(impact, resizing.describe(impact, instance, spec))
        current = instance.current_allocation()
        if impact == resizing.LIVE and placement.resize_in_place(instance, current, spec):
            _apply(instance, changes)
            lifecycle.record_live_change(instance, f"{message}, live: it kept running", actor)
            queue.enqueue("set_limits", instance.pk, current.pk, old.pk)
            return instance
        if impact == resizing.NONE:
            _apply(instance, changes)
            lifecycle.note(instance, message, actor=actor)
            return instance
        allocation = None
        if impact == resizing.RESTART:
            same_gpus = None
            if spec.mode != "whole":
                same_gpus = list(current.claims.values_list("gpu_id", flat=True).distinct())
            try:
                allocation = placement.allocate(
                    instance, spec, host_pk=current.host_id, gpu_pks=same_gpus, replacing=current
                )
            except placement.Busy as exc:
                raise Busy("Its GPU is busy with other placements; try again.") from exc
        if allocation is None and not allow_stop:  # its GPU filled up meanwhile
            raise NeedsConsent(resizing.STOP, resizing.describe(resizing.STOP, instance, spec))
        if allocation is not None:
            _apply(instance, changes)
            lifecycle.transition(
                instance, S.REBOOTING, actor=actor, message=f"{message}, restarting on its GPU"
            )
            queue.enqueue("resize", instance.pk, current.pk)
        else:
            instance.resume_after_stop = True
            _apply(instance, {**changes, "resume_after_stop": True})
            lifecycle.transition(
                instance,
                S.STOPPING,
                actor=actor,
                message=f"{message}: no room on its GPU, stopping to place it again",
            )
            queue.enqueue("stop", instance.pk)
    return instance


def _apply(instance: Instance, changes: dict) -> None:
    Instance.objects.filter(pk=instance.pk).update(**changes, updated_at=timezone.now())
    for name, value in changes.items():
        setattr(instance, name, value)


class LogsUnavailable(InstanceError):
    """The host that holds an instance's logs does not answer: try again (503)."""

    code = ErrorCode.HOST_UNAVAILABLE
    status = 503


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
    "NeedsConsent",
    "QuotaExceeded",
    "launch_instance",
    "stop_instance",
    "start_instance",
    "reboot_instance",
    "resize_instance",
    "terminate_instance",
]
