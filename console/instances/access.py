"""How tenants get into their instances: the SSH keys an instance grants (pushed to its
host's agent), the `ssh` command line, the web ports the console proxies, and the session
events (ssh, terminal) recorded on the instance.

Only members with role member or above get a shell: a viewer's keys are never pushed, a
viewer opens no terminal and no port."""

from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone

from accounts import scopes
from accounts.models import Membership, SshKey
from accounts.roles import OPERATE, RANK, Role
from accounts.ssh_keys import grants_shell
from console.catalog.models import port_errors
from console.celery import enqueue_on_commit
from console.errors import DomainError, ErrorCode
from console.fleet import ssh_authority
from console.fleet.models import Host
from console.instances import lifecycle, locks
from console.instances.models import Instance, State

MAX_PORTS = 16
CONNECT = "instances:connect"  # the scope of terminals and web ports
SHELL_ROLES = [role for role in Role.values if RANK[Role(role)] >= RANK[Role(OPERATE)]]


# --- keys ---------------------------------------------------------------------------------


def launch_keys(tenant, actor, names: list[str] | None) -> list[SshKey]:
    """The keys a launch grants: `names` (the launching user's keys by name, or another
    member's as "username/name"), else all of the launching user's keys in the tenant.
    A ValidationError on `ssh_keys` for an unknown name or the key of a member who may not
    have a shell."""
    actor_pk = getattr(actor, "pk", None)
    mine = SshKey.objects.filter(membership__tenant=tenant, membership__user_id=actor_pk)
    if names is None:
        return list(mine) if actor_pk else []
    chosen, problems = [], []
    for name in dict.fromkeys(names):
        username, slash, key_name = name.rpartition("/")
        if slash:
            found = SshKey.objects.select_related("membership__user").filter(
                membership__tenant=tenant, membership__user__username=username, name=key_name
            )
        else:
            found = mine.filter(name=name).select_related("membership__user")
        key = found.first()
        if key is None:
            owner = f"{username} has" if slash else "You have"
            problems.append(f"{owner} no SSH key named {key_name or name} in this tenant.")
        elif not grants_shell(key.membership):
            problems.append(
                f"{key.membership.user.username} is a {key.membership.role}: their keys "
                "cannot open a shell."
            )
        else:
            chosen.append(key)
    if problems:
        raise ValidationError({"ssh_keys": problems})
    return chosen


def granted_keys(instance_pk: int) -> list[dict]:
    """What the instance's host lets in now: the keys chosen at launch whose members still
    have role member or above (the body of the agent's PUT …/ssh-keys)."""
    keys = SshKey.objects.filter(
        instances__pk=instance_pk,
        membership__role__in=SHELL_ROLES,
        membership__user__is_active=True,
    ).order_by("pk")
    return [
        {"name": key.name, "fingerprint": key.fingerprint, "public_key": key.public_key}
        for key in keys
    ]


def granted_members(instance_pk: int) -> list[str]:
    """Who may hold the instance's terminals now: the pks of its tenant's memberships with role
    member or above and an active user (the `members` of the agent's PUT …/ssh-keys)."""
    pks = Membership.objects.filter(
        tenant__instances__pk=instance_pk,
        role__in=SHELL_ROLES,
        user__is_active=True,
    ).order_by("pk")
    return [str(pk) for pk in pks.values_list("pk", flat=True)]


def keys_changed(tenant_id: int) -> None:
    """A key was deleted or a membership changed in the tenant: once committed, push the key
    sets and the terminals' members of its instances that are on a host (most have not
    changed: the push is idempotent)."""
    pks = list(
        Instance.objects.filter(tenant_id=tenant_id, state__in=lifecycle.ON_HOST).values_list(
            "pk", flat=True
        )
    )
    for pk in pks:
        enqueue_on_commit("console.instances.tasks.push_ssh_keys", pk)


# --- ports --------------------------------------------------------------------------------


def launch_ports_errors(image, ports) -> list[str]:
    """What is wrong with the ports a launch adds to its image's."""
    problems = port_errors(ports)
    if problems:
        return problems
    if len(ports) > MAX_PORTS:
        return [f"At most {MAX_PORTS} ports."]
    if image is None:  # a tenant's own image declares no ports here
        return []
    served = {entry["port"] for entry in image.ports or []}
    return [
        f"Port {entry['port']} is already served by {image.name}."
        for entry in ports
        if entry["port"] in served
    ]


def declared_ports(image_ports: list | None, launch_ports: list | None) -> list[dict]:
    """The web ports the console proxies for an instance: its image's, then its launch's."""
    return [*(image_ports or []), *(launch_ports or [])]


def port_path(instance_id: int, port: int) -> str:
    """Where the console proxies the instance's web port."""
    return f"/instances/{instance_id}/ports/{port}/"


# --- ssh ----------------------------------------------------------------------------------


def ssh_target(instance: Instance) -> dict | None:
    """Where `ssh` reaches the running instance, or None: not running, or its host runs no
    gateway. Needs the instance's current allocation with its host (prefetched as
    `allocations` on the instance page)."""
    if instance.state != State.RUNNING:
        return None
    current = next((a for a in instance.allocations.all() if a.released_at is None), None)
    host: Host | None = current.host if current else None
    if host is None:
        return None
    return ssh_endpoint(
        instance.pk,
        host.address,
        host.name,
        host.ssh_port,
        host.ssh_host_key_fingerprint,
        host.ssh_host_key,
    )


def ssh_endpoint(
    instance_id: int,
    address: str,
    host_name: str,
    ssh_port: int | None,
    fingerprint: str,
    host_key: str,
) -> dict | None:
    """The `ssh` command line to a running instance on a host whose gateway listens at
    `ssh_port` (None: the host runs none), from the host's fields as they are: through the SSH
    front when the console runs one (the same line wherever the instance runs), else straight
    to the host's gateway. `known_hosts`: the lines that let ssh check whom it reaches."""
    if not ssh_port:
        return None
    user = str(instance_id)
    if settings.SSH_FRONT:
        front_host, front_port = ssh_authority.front_address()
        bracketed = f"[{front_host}]" if ":" in front_host else front_host
        jump = f"{user}@{bracketed}" + (f":{front_port}" if front_port != 22 else "")
        return {
            "host": ssh_authority.INSTANCE_HOST,
            "port": 22,
            "user": user,
            "proxy_jump": jump,
            "command": f"ssh -J {jump} {user}@{ssh_authority.INSTANCE_HOST}",
            "host_key_fingerprint": ssh_authority.fingerprint(ssh_authority.front_key()),
            "known_hosts": ssh_authority.known_hosts(),
        }
    hostname = urlsplit(address).hostname or host_name
    port_option = f"-p {ssh_port} " if ssh_port != 22 else ""
    pattern = hostname if ssh_port == 22 else f"[{hostname}]:{ssh_port}"
    return {
        "host": hostname,
        "port": ssh_port,
        "user": user,
        "proxy_jump": None,
        "command": f"ssh {port_option}{user}@{hostname}",
        "host_key_fingerprint": fingerprint,
        "known_hosts": [f"{pattern} {host_key}"] if host_key else [],
    }


# --- sessions -----------------------------------------------------------------------------


def record_session(
    instance: Instance | int,
    message: str,
    *,
    actor=None,
    at: datetime | None = None,
    host: Host | None = None,
    allocation_id: str = "",
) -> bool:
    """An ssh or terminal session opened or ended: an event on the instance (a note, no
    transition), shown live in its tenant's browsers. From an agent (`host`), only about the
    instance's current allocation on that host."""
    pk = instance.pk if isinstance(instance, Instance) else instance
    with transaction.atomic():
        locked = locks.instance(pk, "spec", "region")
        if locked is None:
            return False
        if host is not None:
            current = locked.current_allocation()
            if current is None or current.pk != allocation_id or current.host_id != host.pk:
                return False
        at = min(at, timezone.now()) if at is not None else None
        message = message[:300]
        if at is not None and locked.events.filter(at=at, message=message).exists():
            return False  # the agent sent it again (a retry)
        lifecycle.announce_note(locked, message, actor=actor, at=at)
    return True


def shell_member(membership: Membership | None) -> bool:
    """Whether a (socket's or request's) membership may open a shell or a port (its API
    token, if any, holding instances:connect)."""
    return (
        membership is not None
        and membership.tenant.is_active
        and membership.can(OPERATE)
        and scopes.allows(membership, CONNECT)
    )


@receiver(post_delete, sender=SshKey)
def _key_deleted(sender, instance: SshKey, **kwargs) -> None:
    tenant_id = (
        Membership.objects.filter(pk=instance.membership_id)
        .values_list("tenant_id", flat=True)
        .first()
    )
    if tenant_id is not None:  # else its membership went: _member_removed pushes
        keys_changed(tenant_id)


@receiver(post_save, sender=Membership)
def _role_changed(sender, instance: Membership, created: bool, **kwargs) -> None:
    if not created:  # its keys, and its terminals, may have gone with its role
        keys_changed(instance.tenant_id)


@receiver(post_delete, sender=Membership)
def _member_removed(sender, instance: Membership, **kwargs) -> None:
    keys_changed(instance.tenant_id)


@receiver(post_save, sender=settings.AUTH_USER_MODEL)
def _user_deactivated(sender, instance, **kwargs) -> None:
    """A deactivated user's keys leave every instance of every tenant they belong to."""
    if not instance.is_active:
        for tenant_id in instance.memberships.values_list("tenant_id", flat=True):
            keys_changed(tenant_id)


# --- shells and ports: who may open one, and where it is ----------------------------------


class ConnectRefused(DomainError):
    """Why a terminal or a port is not opened: an HTTP status, and the websocket close code
    that says the same (4000 + the status)."""

    @property
    def close_code(self) -> int:
        return 4000 + self.status


def _not_found() -> ConnectRefused:
    return ConnectRefused("No such instance.", code=ErrorCode.NOT_FOUND, status=404)


@dataclass(frozen=True)
class Target:
    """A running instance's host, for a terminal or a port."""

    instance_pk: int
    host: Host


def target(membership: Membership | None, instance_pk: int, port: int | None = None) -> Target:
    """The host that runs the instance, when the membership (role member or above, in the
    instance's active tenant) may open a shell (or the declared web `port`) there;
    ConnectRefused otherwise: 404 to anyone outside the tenant (or outside its API token's
    name prefix) and for undeclared ports, 403 to a viewer and to a scoped token without
    instances:connect, 409 while it is not running."""
    if membership is None or not membership.tenant.is_active:
        raise _not_found()
    instance = (
        Instance.objects.select_related("image")
        .filter(pk=instance_pk, tenant_id=membership.tenant_id)
        .exclude(state=State.TERMINATED)
        .first()
    )
    if instance is None or not scopes.covers_instance(membership, instance.name):
        raise _not_found()
    if not scopes.allows(membership, CONNECT):
        detail = scopes.missing_detail(CONNECT)
        raise ConnectRefused(detail, code=ErrorCode.SCOPE_MISSING, status=403)
    if port is not None and port not in {
        entry["port"] for entry in declared_ports(instance.image_ports, instance.ports)
    }:
        detail = f"{instance.name} serves no port {port}."
        raise ConnectRefused(detail, code=ErrorCode.NOT_FOUND, status=404)
    if not membership.can(OPERATE):
        raise ConnectRefused(
            f"Your role ({membership.role}) cannot open a shell or a port; it needs member.",
            code=ErrorCode.PERMISSION_DENIED,
            status=403,
        )
    current = instance.current_allocation() if instance.state == State.RUNNING else None
    if current is None:
        raise ConnectRefused(
            f"{instance.name} is {instance.state}, not running.",
            code=ErrorCode.NOT_RUNNING,
            status=409,
        )
    return Target(instance_pk=instance.pk, host=current.host)


def shell_stands(membership_id: int, token_id: int | None) -> bool:
    """Whether an open terminal's member may still have it (membership, role, token)."""
    from accounts.services import access_stands

    return (
        access_stands(membership_id, token_id)
        and Membership.objects.filter(pk=membership_id, role__in=SHELL_ROLES).exists()
    )
