"""Every change to volumes: create, attach, detach, delete, and what a launch and a terminate do
to them (signals.launching, signals.terminating). Each runs in one transaction; the agent work
(removing a deleted volume's disk from its host) is queued after the commit.

The tenant's storage quota (accounts.Quota.storage_quota_gib) counts the GiB of its live
volumes, kept instance disks among them; an instance's own disk does not count (its spec
sizes it, and the instance quota bounds it)."""

import posixpath
import re
from decimal import ROUND_HALF_UP, Decimal

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from accounts import locks as account_locks
from accounts.models import Tenant
from console import integers
from console.audit import recorder as audit
from console.catalog.models import Region
from console.celery import enqueue_on_commit
from console.errors import DomainError, ErrorCode
from console.instances import locks
from console.instances.models import Instance, State
from console.volumes import locks as volume_locks
from console.volumes.models import NAME_PATTERN, Volume

MAX_SIZE_GIB = 16384
DEFAULT_DISK_GIB = 10  # the size of an instance disk its launch did not size (agent/volumes.py)
MAX_VOLUMES_PER_INSTANCE = 16
# Where the container's own things live, and the instance's own disk: no volume there or under.
RESERVED_MOUNTS = (
    "/workspace", "/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
    "/libx32", "/usr", "/boot", "/run", "/var", "/tmp",  # noqa: S108 (a path in the container)
)  # fmt: skip
MOUNT_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}")
ATTACHABLE = (State.STOPPED, State.FAILED)


class VolumeError(DomainError):
    code = ErrorCode.INVALID_STATE


CENT = Decimal("0.01")


def monthly_price(region: Region, size_gib: int) -> Decimal:
    """What a volume of `size_gib` costs a month in `region` (shown before it is created)."""
    return (region.volume_price_per_gib_month * size_gib).quantize(CENT, rounding=ROUND_HALF_UP)


def mount_path_error(path: str) -> str | None:
    """Why `path` cannot be a volume's mount path (None: it can)."""
    if not isinstance(path, str) or not path.startswith("/") or len(path) > 200:
        return "Give an absolute path inside the container, like /data."
    parts = path.split("/")[1:]
    if path == "/" or posixpath.normpath(path) != path or any(p in (".", "..") for p in parts):
        return "Give a plain path: no trailing slash, no . or .. parts."
    if not all(MOUNT_PART.fullmatch(part) for part in parts):
        return "Use letters, digits, _ . - between the slashes."
    for reserved in RESERVED_MOUNTS:
        if path == reserved or path.startswith(f"{reserved}/"):
            return f"{reserved} is the container's own (or the instance disk's); choose another."
    return None


def default_mount_path(volume: Volume) -> str:
    return f"/mnt/{volume.name}"


def _name_errors(tenant: Tenant, name: str) -> str | None:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        return "Use 1 to 63 lowercase letters, digits and dashes (not at either end)."
    if Volume.objects.filter(tenant=tenant, name=name, deleted_at__isnull=True).exists():
        return f"You already have a volume named {name}."
    return None


def storage_used(tenant: Tenant) -> int:
    """The GiB of the tenant's live volumes."""
    used = Volume.objects.filter(tenant=tenant, deleted_at__isnull=True).aggregate(
        total=Sum("size_gib")
    )
    return used["total"] or 0


def create_volume(
    tenant: Tenant, *, name: str, size_gib: int, region: Region, actor=None, host=None
) -> Volume:
    """A new volume, on no host yet: it is made on the host of the first instance it is
    attached to (or on `host`, where a snapshot is restored into it). Billed from now until
    deleted, at the region's price of now."""
    errors = {}
    if not isinstance(size_gib, int) or not 1 <= size_gib <= MAX_SIZE_GIB:
        errors["size_gib"] = f"Give a size from 1 to {MAX_SIZE_GIB} GiB."
    with transaction.atomic():
        quota = account_locks.quota(tenant.pk)  # serialises the tenant's quota checks
        if problem := _name_errors(tenant, name):
            errors["name"] = problem
        if "size_gib" not in errors:
            used = storage_used(tenant)
            if used + size_gib > quota.storage_quota_gib:
                errors["size_gib"] = (
                    f"Your storage quota is {quota.storage_quota_gib} GiB and your volumes "
                    f"hold {used} GiB: at most {max(0, quota.storage_quota_gib - used)} GiB more."
                )
        if errors:
            raise ValidationError(errors)
        volume = Volume.objects.create(
            tenant=tenant,
            created_by=actor if getattr(actor, "pk", None) else None,
            name=name,
            size_gib=size_gib,
            region=region,
            host=host,
            price_per_gib_month=region.volume_price_per_gib_month,
        )
        audit.record("volume.create", volume, after=_shown(volume))
    return volume


def _shown(volume: Volume) -> dict:
    """What the audit log keeps of a volume."""
    return {
        "name": volume.name,
        "size_gib": volume.size_gib,
        "state": volume.state,
        "instance": volume.instance_id,
        "mount_path": volume.mount_path,
    }


def _locked(volume: Volume) -> Volume:
    locked = volume_locks.volume(volume.pk)
    if locked is None or locked.deleted_at is not None:
        raise VolumeError("This volume no longer exists.", code=ErrorCode.NOT_FOUND, status=404)
    return locked


def _attach(volume: Volume, instance: Instance, mount_path: str | None) -> None:
    """Attach the (locked) volume to the (locked) instance, or a ValidationError on `field`."""
    mount_path = mount_path or default_mount_path(volume)
    if volume.instance_id is not None:
        raise ValidationError({"volume": f"{volume.name} is attached to another instance."})
    if volume.region_id != instance.region_id:
        raise ValidationError(
            {"volume": f"{volume.name} is in {volume.region}, the instance in {instance.region}."}
        )
    if problem := mount_path_error(mount_path):
        raise ValidationError({"mount_path": problem})
    others = list(instance.volumes.all())
    if len(others) >= MAX_VOLUMES_PER_INSTANCE:
        raise ValidationError({"volume": f"At most {MAX_VOLUMES_PER_INSTANCE} volumes."})
    for other in others:
        a, b = sorted((other.mount_path, mount_path))
        if a == b or b.startswith(f"{a}/"):
            raise ValidationError({"mount_path": f"{other.name} is mounted at {other.mount_path}."})
    hosts = {instance.disk_host_id, volume.host_id, *(o.host_id for o in others)} - {None}
    if len(hosts) > 1:
        raise ValidationError(
            {"volume": f"{volume.name} lives on another host than the instance's disk."}
        )
    volume.instance, volume.mount_path, volume.state = instance, mount_path, Volume.State.ATTACHED
    volume.save(update_fields=["instance", "mount_path", "state"])


def _lock_instance(instance: Instance, field: str = "instance") -> Instance:
    locked = locks.instance_to_change(instance.pk)
    if locked is None or locked.state == State.TERMINATED:
        raise ValidationError({field: "No such instance."})
    return locked


def attach_volume(volume: Volume, instance: Instance, *, mount_path: str | None = None, actor=None):
    """Attach to a stopped instance of the same tenant and region (it mounts the volume at
    `mount_path` from its next start)."""
    with transaction.atomic():
        instance = _lock_instance(instance)
        volume = _locked(volume)
        if instance.tenant_id != volume.tenant_id:
            raise ValidationError({"instance": "No such instance."})
        if instance.state not in ATTACHABLE:
            raise VolumeError(f"Stop {instance.name} first: it is {instance.state}.")
        before = _shown(volume)
        _attach(volume, instance, mount_path)
        audit.record("volume.attach", volume, before=before, after=_shown(volume))
    return volume


def detach_volume(volume: Volume, *, actor=None) -> Volume:
    """Detach from its instance, which must be stopped (or not yet placed)."""
    with transaction.atomic():
        # its instance first, as attach and terminate lock them
        instance = _lock_instance(volume.instance) if volume.instance_id is not None else None
        volume = _locked(volume)
        if instance is None or volume.instance_id != instance.pk:
            raise VolumeError(f"{volume.name} is attached to no instance.")
        if instance.state not in (*ATTACHABLE, State.PENDING):
            raise VolumeError(f"Stop {instance.name} first: it is {instance.state}.")
        if Instance.objects.filter(pk=instance.pk, shelf__isnull=False).exists():
            raise VolumeError(
                f"{instance.name} is shelved (or being shelved) with {volume.name}, whose data "
                "is in its snapshot: start it first.",
                code=ErrorCode.INSTANCE_SHELVED,
            )
        before = _shown(volume)
        _detach(volume)
        audit.record("volume.detach", volume, before=before, after=_shown(volume))
    return volume


def _detach(volume: Volume) -> None:
    volume.instance, volume.mount_path, volume.state = None, "", Volume.State.AVAILABLE
    volume.save(update_fields=["instance", "mount_path", "state"])


def delete_volume(volume: Volume, *, actor=None) -> Volume:
    """Delete: its billing ends now, its disk leaves its host after the commit. Refused while
    it is attached."""
    with transaction.atomic():
        volume = _locked(volume)
        if volume.instance_id is not None:
            raise VolumeError(f"{volume.name} is attached to an instance: detach it first.")
        before = _shown(volume)
        volume.state, volume.deleted_at = Volume.State.DELETED, timezone.now()
        volume.save(update_fields=["state", "deleted_at"])
        if volume.host_id is not None:
            enqueue_on_commit("console.volumes.tasks.remove_disk", volume.pk)
        audit.record("volume.delete", volume, before=before, after=_shown(volume))
    return volume


def tenant_volume(tenant: Tenant, ref, field: str, name_prefix: str = "") -> Volume:
    """The tenant's live volume by id or name; a ValidationError on `field` otherwise. With
    `name_prefix` (an API token's: accounts.scopes.instance_prefix) only a volume whose name
    starts with it is found, as only such instances are."""
    volumes = Volume.objects.filter(
        tenant=tenant, deleted_at__isnull=True, name__startswith=name_prefix
    )
    found = None
    if (pk := integers.reference_id(ref)) is not None:
        found = volumes.filter(pk=pk).first()
    if found is None and isinstance(ref, str):
        found = volumes.filter(name=ref).first()
    if found is None:
        raise ValidationError({field: f"You have no volume {ref}."})
    return found


def attach_at_launch(sender, instance: Instance, volumes: list[dict], **kwargs) -> None:
    """signals.launching: attach what the launch asked for, by id or name, each at its mount
    path (a ValidationError on `volumes` otherwise)."""
    if not volumes:
        return
    try:
        for entry in volumes:
            volume = _locked(tenant_volume(instance.tenant, entry.get("volume"), "volumes"))
            _attach_naming(volume, instance, entry.get("mount_path"))
    except ValidationError as error:
        messages = [m for ms in error.message_dict.values() for m in ms]
        raise ValidationError({"volumes": messages}) from error
    except VolumeError as error:
        raise ValidationError({"volumes": error.detail}) from error


def _attach_naming(volume: Volume, instance: Instance, mount_path: str | None) -> None:
    """_attach, a mount path's error naming its volume (a launch may attach several)."""
    try:
        _attach(volume, instance, mount_path)
    except ValidationError as error:
        raise ValidationError(
            {
                field: [f"{volume.name}: {m}" if field == "mount_path" else m for m in messages]
                for field, messages in error.message_dict.items()
            }
        ) from error


def on_terminating(sender, instance: Instance, keep_disk: bool, actor=None, **kwargs) -> None:
    """signals.terminating: its volumes are detached; with `keep_disk` its own disk becomes a
    volume of the tenant named after it (the disk stays on its host, the same data). Keeping
    is never refused for the quota (the data would be lost), but the kept disk counts."""
    for volume in volume_locks.of_instance(instance.pk):
        _detach(volume)
    if not keep_disk:
        return
    if instance.disk_host_id is None:
        raise ValidationError({"keep_disk": f"{instance.name} has no disk yet: it never ran."})
    name = _free_name(instance)
    volume = Volume.objects.create(
        tenant_id=instance.tenant_id,
        created_by=actor if getattr(actor, "pk", None) else None,
        name=name,
        size_gib=instance.disk_gib or DEFAULT_DISK_GIB,
        region_id=instance.region_id,
        host_id=instance.disk_host_id,
        disk_name=instance.disk_name,
        kept_from=instance,
        price_per_gib_month=instance.region.volume_price_per_gib_month,
    )
    audit.record("volume.keep", volume, after=_shown(volume))


def _free_name(instance: Instance) -> str:
    """A volume name from the instance's, free among the tenant's live volumes."""
    base = f"{instance.name}-disk"[:56].rstrip("-")
    taken = set(
        Volume.objects.filter(
            tenant_id=instance.tenant_id, deleted_at__isnull=True, name__startswith=base
        ).values_list("name", flat=True)
    )
    if base not in taken:
        return base
    return next(f"{base}-{n}" for n in range(2, len(taken) + 3) if f"{base}-{n}" not in taken)


def disk_to_remove(volume_pk: int) -> Volume | None:
    """A deleted volume whose disk is still on its host (None: nothing to do)."""
    return (
        Volume.objects.select_related("host")
        .filter(pk=volume_pk, deleted_at__isnull=False, host__isnull=False)
        .first()
    )


def disk_removed(volume_pk: int) -> None:
    Volume.objects.filter(pk=volume_pk).update(host=None)
