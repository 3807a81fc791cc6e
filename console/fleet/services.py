"""Every change to the fleet goes through one of these functions: join tokens, registration,
heartbeats, host status, GPU modes. The agent API, the fleet page, the admin, the management
command and the watchdog call them and stay thin."""

import logging
import re
import secrets
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Q, QuerySet
from django.utils import timezone

from console.audit import recorder as audit
from console.catalog.models import GpuModel, Mode, Region
from console.celery import enqueue_on_commit
from console.errors import DomainError, ErrorCode
from console.fleet import agent_client, identity, images, locks, ssh_authority
from console.fleet.addresses import address_problem, is_loopback
from console.fleet.models import Gpu, Host, HostEvent, JoinToken
from console.fleet.signals import host_back
from console.notices import notice

log = logging.getLogger(__name__)

SYSTEM = "system"
HOSTNAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# The agent samples every second; it heartbeats a few times per grace period so that one lost
# heartbeat never makes a host unreachable.
SAMPLE_INTERVAL_SECONDS = 1.0


def host_for_secret(secret: str) -> Host | None:
    """The host whose agent holds this secret (console/fleet/identity.py: its current one, the
    one before it while its grace lasts, or a new one it was handed): found by the secret's
    hash, then the secret itself compared in constant time."""
    rows = identity.rows_for_secret(secret)
    return Host.objects.filter(pk=rows[0][0]).first() if rows else None


def host_rows_for_secret(secret: str, *fields: str) -> list[tuple]:
    """`(pk, name, *fields)` of the host whose agent holds this secret, found and checked as by
    `host_for_secret`, in one query of only those columns: a field across a relation
    (`gpus__uuid`) gives a row per related row (one of Nones when there is none), as
    `values_list` does. Empty: no host holds it. Read from the database every time, so a
    deleted, re-keyed or revoked host's old secret never passes."""
    return identity.rows_for_secret(secret, "name", *fields)


def heartbeat_interval() -> float:
    return max(0.5, min(5.0, settings.HOST_HEARTBEAT_GRACE_SECONDS / 3))


class RegistrationRefused(DomainError):
    """Why an agent may not join; `status` and `code` are what the agent API answers, and
    `field` the field of the request it is about (none: the request as a whole)."""

    status = 400

    def __init__(self, detail: str, *, field: str = "", **kwargs) -> None:
        super().__init__(detail, **kwargs)
        self.field = field


def _event(host: Host, from_status: str, to_status: str, message: str, actor=None) -> HostEvent:
    label = actor.get_username() if actor is not None else SYSTEM
    return HostEvent.objects.create(
        host=host,
        actor=actor,
        actor_label=label,
        from_status=from_status,
        to_status=to_status,
        message=message[:300],
    )


# --- join tokens -------------------------------------------------------------------------

JOIN_TOKEN_MAX_TTL_HOURS = 24 * 30


def issue_join_token(token: JoinToken, ttl_hours: float | None = None) -> str:
    """Give `token` (region, note, created_by set) a fresh secret and an expiry, save it, and
    answer the raw token: it is shown once and only its hash is kept."""
    ttl = settings.JOIN_TOKEN_TTL_HOURS if ttl_hours is None else ttl_hours
    if not 0 < ttl <= JOIN_TOKEN_MAX_TTL_HOURS:  # also refuses NaN
        raise ValidationError(
            {
                "ttl_hours": "A join token lives more than 0 and at most "
                f"{JOIN_TOKEN_MAX_TTL_HOURS} hours."
            }
        )
    prefix = f"{JoinToken.PREFIX}_{secrets.token_hex(4)}"
    raw = f"{prefix}_{secrets.token_urlsafe(32)}"
    token.prefix = prefix
    token.token_hash = JoinToken.hash(raw)
    token.created_at = timezone.now()
    token.expires_at = token.created_at + timedelta(hours=ttl)
    token.note = (token.note or "").strip()
    token.full_clean()
    token.save()
    return raw


def create_join_token(
    region: Region | str, note: str = "", created_by=None, ttl_hours: float | None = None
) -> tuple[JoinToken, str]:
    """A one-time token that lets one new host join `region` (a Region or its code)."""
    if isinstance(region, str):
        found = Region.objects.filter(code=region).first()
        if found is None:
            known = ", ".join(Region.objects.values_list("code", flat=True)) or "none"
            raise ValidationError({"region": f"Unknown region {region!r}; known: {known}."})
        region = found
    token = JoinToken(region=region, note=note, created_by=created_by)
    raw = issue_join_token(token, ttl_hours)
    return token, raw


def revoke_join_token(token: JoinToken) -> JoinToken:
    """An unused token stops working now (a used one has done its job already)."""
    now = timezone.now()
    JoinToken.objects.filter(pk=token.pk, used_at__isnull=True, expires_at__gt=now).update(
        expires_at=now
    )
    token.refresh_from_db()
    return token


def _token_refusal(token_hash: str, now) -> RegistrationRefused:
    token = JoinToken.objects.filter(token_hash=token_hash).select_related("host").first()
    if token is None:
        return RegistrationRefused(
            "This join token is not valid: ask the operator for one.",
            code=ErrorCode.INVALID_JOIN_TOKEN,
            status=403,
        )
    if token.used_at is not None:
        by = f" by host {token.host.name}" if token.host else ""
        return RegistrationRefused(
            f"Join token {token.prefix}… was already used{by} on {token.used_at:%Y-%m-%d %H:%M} "
            "UTC; a join token registers one host once. Ask the operator for a new one.",
            code=ErrorCode.JOIN_TOKEN_USED,
            status=403,
        )
    return RegistrationRefused(
        f"Join token {token.prefix}… expired on {token.expires_at:%Y-%m-%d %H:%M} UTC; "
        "ask the operator for a new one.",
        code=ErrorCode.JOIN_TOKEN_EXPIRED,
        status=403,
    )


# --- registration and heartbeats --------------------------------------------------------


def valid_address(address: str) -> bool:
    """An agent's base URL: http(s) and a host name (short cluster names are fine)."""
    parts = urlsplit(address)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _check_address(address: str, remote_addr: str) -> str:
    """The agent's base URL, if the console may call it there (console.fleet.addresses); a
    loopback one only for a registration that came from loopback."""
    problem = address_problem(address, local=is_loopback(remote_addr))
    if problem:
        detail = f"address {address!r}: {problem}"
        raise RegistrationRefused(detail, code=ErrorCode.INVALID_ADDRESS, field="address")
    return address.rstrip("/")


def _gpu_models(gpus: list[dict]) -> dict[str, GpuModel]:
    codes = {gpu["model"] for gpu in gpus}
    return {m.code: m for m in GpuModel.objects.filter(code__in=codes)}


def _gpu_fields(item: dict, model: GpuModel) -> dict:
    return {
        "index": item["index"],
        "model": model,
        "name": (item.get("name") or model.name)[:80],
        "pci_bus_id": (item.get("pci_bus_id") or "")[:32],
        "memory_mib": item.get("memory_mib") or model.memory_mib,
        "mode": item["mode"],
        "mig_enabled": bool(item.get("mig_enabled")),
        "mig_devices": item.get("mig_devices") or [],
        "driver_version": (item.get("driver_version") or "")[:32],
        "cuda_version": (item.get("cuda_version") or "")[:16],
        "healthy": item["healthy"],
        "health_reason": ""
        if item["healthy"]
        else (item.get("health_reason") or "unhealthy")[:200],
    }


def _host_fields(inventory: dict) -> dict:
    return {
        "backend": (inventory.get("backend") or "")[:16],
        "runtime": (inventory.get("runtime") or "")[:16],
        "vcpus": inventory.get("cpu_count") or 0,
        "ram_mib": inventory.get("memory_mib") or 0,
        "container_networks": list(inventory.get("container_networks") or []),
        **_ssh_fields(inventory.get("ssh")),
    }


def _ssh_fields(ssh) -> dict:
    """The agent's SSH gateway ({"port", "host_key_fingerprint", "host_key", "certificate"},
    or null when it is off)."""
    port = ssh.get("port") if isinstance(ssh, dict) else None
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return {
            "ssh_port": None,
            "ssh_host_key_fingerprint": "",
            "ssh_host_key": "",
            "ssh_certificate_expires_at": None,
        }
    fingerprint = ssh.get("host_key_fingerprint")
    fingerprint = fingerprint[:80] if isinstance(fingerprint, str) else ""
    key = ssh.get("host_key")
    return {
        "ssh_port": port,
        "ssh_host_key_fingerprint": fingerprint,
        "ssh_host_key": ssh_authority.gateway_key(key, fingerprint) if isinstance(key, str) else "",
        "ssh_certificate_expires_at": ssh_authority.certified_until(ssh.get("certificate")),
    }


def certify_when_due(host: Host) -> None:
    """Once committed, give the host's gateway a certificate of the console's CA when it has
    none or one that expires soon (the SSH front's users trust the gateways through it)."""
    if ssh_authority.needs_certificate(host):
        enqueue_on_commit("console.fleet.tasks.certify_gateway", host.pk)


def certify_due_gateways() -> list[int]:
    """Hand out the certificates that are due (renewals, and any a failed push left out)."""
    if not settings.SSH_FRONT:
        return []
    renew_by = timezone.now() + timedelta(days=ssh_authority.RENEW_DAYS)
    due = list(
        Host.objects.filter(ssh_port__isnull=False)
        .exclude(ssh_host_key="")
        .exclude(status__in=(Host.Status.UNREACHABLE, Host.Status.RETIRED))
        .filter(
            Q(ssh_certificate_expires_at__isnull=True) | Q(ssh_certificate_expires_at__lt=renew_by)
        )
        .values_list("pk", flat=True)
    )
    for pk in due:
        enqueue_on_commit("console.fleet.tasks.certify_gateway", pk)
    return due


def certify_gateway(host_pk: int) -> bool:
    """Sign the gateway's key and hand the certificate to its agent (idempotent: a new one each
    time, the same name and key). False when there is nothing to do."""
    host = Host.objects.filter(pk=host_pk).first()
    if host is None or host.status == Host.Status.RETIRED:
        return False
    if not ssh_authority.needs_certificate(host):
        return False
    certificate, until = ssh_authority.sign(host.ssh_host_key, host.name)
    agent_client.put_host_certificate(host, certificate)
    Host.objects.filter(pk=host.pk, ssh_host_key=host.ssh_host_key).update(
        ssh_certificate_expires_at=until
    )
    log.info("host %s: SSH gateway certified until %s", host.name, until.isoformat())
    return True


@transaction.atomic
def register_host(
    *,
    join_token: str,
    hostname: str,
    address: str,
    remote_addr: str,
    region_code: str = "",
    agent_version: str = "",
    inventory: dict,
) -> tuple[Host, str]:
    """Consume the join token and create the host and its GPUs; answer the host and the secret
    it shares with its agent. `remote_addr`: where the registration came from (a loopback
    address is the agent's only when it came from loopback). Any refusal rolls everything
    back, the token included."""
    now = timezone.now()
    token_hash = JoinToken.hash(join_token)
    # One UPDATE consumes the token: of two agents racing with it, exactly one changes the row.
    claimed = JoinToken.objects.filter(
        token_hash=token_hash, used_at__isnull=True, expires_at__gt=now
    ).update(used_at=now)
    if not claimed:
        raise _token_refusal(token_hash, now)
    token = JoinToken.objects.select_related("region").get(token_hash=token_hash)
    region = token.region
    if region_code and region_code != region.code:
        raise RegistrationRefused(
            f"This join token is for region {region.code}, but the agent says {region_code}.",
            code=ErrorCode.REGION_MISMATCH,
        )
    if not HOSTNAME_RE.fullmatch(hostname):
        raise RegistrationRefused(
            f"hostname must match {HOSTNAME_RE.pattern}, not {hostname!r}",
            code=ErrorCode.INVALID_HOSTNAME,
        )
    address = _check_address(address, remote_addr)
    gpus, _ = _readable(hostname, inventory)  # an unreadable GPU gets its row once read
    models = _gpu_models(gpus)
    unknown = sorted({gpu["model"] for gpu in gpus} - set(models))
    if unknown:
        known = ", ".join(GpuModel.objects.values_list("code", flat=True)) or "none"
        raise RegistrationRefused(
            f"Unknown GPU model {', '.join(map(repr, unknown))}: add it to the catalog first "
            f"(known: {known}).",
            code=ErrorCode.UNKNOWN_GPU_MODEL,
        )
    taken = Host.objects.filter(name=hostname).first()
    if taken is not None:
        raise _hostname_taken(taken)
    secret = secrets.token_urlsafe(32)
    host = Host(
        name=hostname,
        region=region,
        address=address,
        agent_version=(agent_version or inventory.get("agent_version") or "")[:40],
        status=Host.Status.ACTIVE,
        admin_status=Host.Status.ACTIVE,
        status_changed_at=now,
        last_heartbeat_at=now,
        registered_at=now,
        inventory_digest=(inventory.get("digest") or "")[:64],
        **_host_fields(inventory),
    )
    host.set_secret(secret)
    try:
        with transaction.atomic():
            host.save()
            Gpu.objects.bulk_create(
                Gpu(host=host, uuid=gpu["uuid"], **_gpu_fields(gpu, models[gpu["model"]]))
                for gpu in gpus
            )
    except IntegrityError:
        taken = Host.objects.filter(name=hostname).first()
        if taken is not None:
            raise _hostname_taken(taken) from None
        raise RegistrationRefused(
            "A GPU of this inventory is already registered to another host (same UUID).",
            code=ErrorCode.GPU_ALREADY_REGISTERED,
            status=409,
        ) from None
    JoinToken.objects.filter(pk=token.pk).update(host=host)
    _event(host, "", Host.Status.ACTIVE, f"registered with join token {token.prefix}…")
    _sync_images(host, inventory)
    certify_when_due(host)
    log.info("host %s registered in %s with %d GPU(s)", host.name, region.code, len(gpus))
    return host, secret


def _hostname_taken(host: Host) -> RegistrationRefused:
    return RegistrationRefused(
        f"A host named {host.name!r} is already registered (status {host.status}, since "
        f"{host.registered_at:%Y-%m-%d %H:%M} UTC). Give this machine another --hostname, or "
        "delete the old host in the admin first.",
        code=ErrorCode.HOSTNAME_TAKEN,
        status=409,
    )


def sync_inventory(host: Host, inventory: dict) -> bool:
    """Make the host's GPUs what the inventory says (the caller holds the host row's lock).
    Answer whether every GPU could be synced; if not, the next heartbeat tries again."""
    try:
        with transaction.atomic():
            return _sync_gpus(host, inventory)
    except IntegrityError as exc:
        log.error("host %s: inventory not synced: %s", host.name, exc)
        return False


def _readable(host_name: str, inventory: dict) -> tuple[list[dict], list[dict]]:
    """The inventory's GPUs split into those the agent could read and those it could not
    (no UUID: it cannot tell which GPU sits in that slot)."""
    readable = [gpu for gpu in inventory["gpus"] if gpu["uuid"] is not None]
    unreadable = [gpu for gpu in inventory["gpus"] if gpu["uuid"] is None]
    for gpu in unreadable:
        log.warning(
            "host %s: GPU %d cannot be read: %s",
            host_name, gpu["index"], gpu.get("health_reason") or "no UUID",
        )  # fmt: skip
    return readable, unreadable


def _sync_gpus(host: Host, inventory: dict) -> bool:
    now = timezone.now()
    gpus, unreadable = _readable(host.name, inventory)
    items = {item["uuid"]: item for item in gpus}
    models = _gpu_models(gpus)
    existing = {gpu.uuid: gpu for gpu in locks.gpus_of(host)}
    missing = {gpu.index: gpu for uuid, gpu in existing.items() if uuid not in items}
    complete = True
    for item in unreadable:  # the GPU known in that slot, if any, is unhealthy
        gpu = missing.pop(item["index"], None)
        reason = (item.get("health_reason") or "cannot be read")[:200]
        if gpu is not None and (gpu.healthy or gpu.health_reason != reason):
            Gpu.objects.filter(pk=gpu.pk).update(
                healthy=False, health_reason=reason, health_changed_at=now
            )
    wanted = []
    for uuid, item in items.items():
        if item["model"] not in models:
            log.warning("host %s: GPU %s has unknown model %r", host.name, uuid, item["model"])
            complete = False
            continue
        holder = missing.get(item["index"])
        if holder is not None:
            if holder.claims.exists():
                log.warning(
                    "host %s: GPU %s cannot take index %d, still claimed by missing GPU %s",
                    host.name, uuid, item["index"], holder.uuid,
                )  # fmt: skip
                complete = False
                continue
            holder.delete()  # replaced: another GPU sits in its slot now
            del missing[item["index"]]
        wanted.append(item)
    # GPUs that changed index move out of the way first: (host, index) is unique.
    moving = [existing[i["uuid"]] for i in wanted if i["uuid"] in existing]
    moving = [gpu for gpu in moving if gpu.index != items[gpu.uuid]["index"]]
    for n, gpu in enumerate(moving):
        Gpu.objects.filter(pk=gpu.pk).update(index=20000 + n)
    for item in wanted:
        fields = _gpu_fields(item, models[item["model"]])
        gpu = existing.get(item["uuid"])
        if gpu is not None:
            if gpu.healthy != fields["healthy"]:
                fields["health_changed_at"] = now
            Gpu.objects.filter(pk=gpu.pk).update(**fields)
            continue
        elsewhere = Gpu.objects.filter(uuid=item["uuid"]).select_related("host").first()
        if elsewhere is not None:
            log.warning("host %s: GPU %s belongs to %s", host.name, item["uuid"], elsewhere.host)
            complete = False
            continue
        Gpu.objects.create(host=host, uuid=item["uuid"], health_changed_at=now, **fields)
        log.info("host %s: new GPU %d (%s)", host.name, item["index"], item["uuid"])
    for gpu in missing.values():
        if gpu.healthy or gpu.health_reason != Gpu.MISSING:
            Gpu.objects.filter(pk=gpu.pk).update(
                healthy=False, health_reason=Gpu.MISSING, health_changed_at=now
            )
            log.warning("host %s: GPU %d (%s) is missing", host.name, gpu.index, gpu.uuid)
    return complete


def record_heartbeat(
    host: Host,
    *,
    agent_version: str = "",
    inventory_digest: str = "",
    inventory: dict | None = None,
    address: str = "",
    engine: dict | None = None,
) -> Host:
    """An agent is alive: note it, sync its GPUs when its inventory changed, and bring an
    unreachable host back to the status its operator chose. The address it reports never moves
    the host (only the operator or a new join does, console/fleet/identity.py): another one is
    a host event, once. `engine`: whether its container engine answers (_engine_fields)."""
    now = timezone.now()
    with transaction.atomic():
        locked = locks.host(host.pk)
        updates: dict = {"last_heartbeat_at": now}
        updates.update(_reported_address(locked, address.rstrip("/")))
        updates.update(_engine_fields(locked, engine, now))
        if agent_version:
            updates["agent_version"] = agent_version[:40]
        digest = inventory_digest or (inventory or {}).get("digest") or ""
        if inventory is not None and (not digest or digest != locked.inventory_digest):
            complete = sync_inventory(locked, inventory)
            updates.update(
                _host_fields(inventory), inventory_digest=digest[:64] if complete else ""
            )
            _sync_images(locked, inventory, updates)
        Host.objects.filter(pk=host.pk).update(**updates)
        if locked.status == Host.Status.UNREACHABLE:
            back = Host.objects.filter(pk=host.pk, status=Host.Status.UNREACHABLE).update(
                status=F("admin_status"), unreachable_since=None, status_changed_at=now
            )
            if back:
                silent = (now - (locked.unreachable_since or now)).total_seconds()
                _event(
                    locked,
                    Host.Status.UNREACHABLE,
                    locked.admin_status,
                    f"heartbeats resumed (unreachable for {silent:.0f} s)",
                )
                log.info("host %s is back: %s", locked.name, locked.admin_status)
                _restart_failover_clocks(locked, now)
                transaction.on_commit(lambda: host_back.send(sender=Host, host=locked))
    host.refresh_from_db()
    if "ssh_port" in updates:
        certify_when_due(host)
    return host


def _engine_fields(host: Host, engine: dict | None, now: datetime) -> dict:
    """The host's fields after its agent said whether its container engine answers
    (`engine`: {"state": "up"|"down", "since": datetime, "detail": str}; None: the agent has
    no engine, nothing changes). A change is a host event and, when the engine went down, a
    `host.engine_down` notice to the tenants with instances there. The agent's `since` is
    taken between the host's previous heartbeat (whose ping found the engine up) and now, so
    that an agent's clock can neither move the outage before it nor after it."""
    if engine is None:
        return {}
    down = host.engine_down_since
    if engine["state"] == "up":
        if down is None:
            return {}
        silent = (now - down).total_seconds()
        report(host, f"the container engine answers again (it did not for {silent:.0f} s)")
        return {"engine_down_since": None, "engine_detail": ""}
    if down is not None:
        return {}
    since = min(engine.get("since") or now, now)
    if host.last_heartbeat_at is not None:
        since = max(since, host.last_heartbeat_at)
    detail = engine.get("detail") or "no answer"
    report(
        host, f"the container engine does not answer since {since:%Y-%m-%d %H:%M:%S} UTC: {detail}"
    )
    _tell_tenants(
        host,
        "host.engine_down",
        lambda names: (
            f"The container engine on host {host.name} does not answer since "
            f"{since:%Y-%m-%d %H:%M:%S} UTC; your instance(s) there cannot be reached and are not "
            f"billed as running until it answers: {', '.join(names)}."
        ),
        {"host": host.name, "since": since.isoformat()},  # the engine's error: the operators'
    )
    return {"engine_down_since": since, "engine_detail": detail}


def _reported_address(host: Host, address: str) -> dict:
    """The host's fields after its agent reported `address` (empty: none): the first report of
    an address that is not the host's is a host event for the operator, not a move."""
    if not address or address == host.reported_address:
        return {}
    if address == host.address:
        return {"reported_address": ""}
    report(
        host,
        f"the agent reports the address {address[:120]}, not {host.address}: the console keeps "
        "calling it at its own (an operator changes it on the host's page, or the host joins "
        "again)",
    )
    return {"reported_address": address[:200]}


def _sync_images(host: Host, inventory: dict, updates: dict | None = None) -> None:
    """The images the host holds and its agent's image settings (console/fleet/images.py),
    into `updates` (else saved now); its settings pushed when they are not what they
    should be."""
    fields = images.sync(host, inventory)
    if updates is None:
        Host.objects.filter(pk=host.pk).update(**fields)
    else:
        updates.update(fields)
    host.image_settings = fields["image_settings"]
    images.push_when_due(host)


def _restart_failover_clocks(back: Host, now: datetime) -> None:
    """`back` went silent together with the hosts whose last heartbeat is within a grace period
    of its own (hosts_to_fail_over held them all: the console's outage, most likely). Now that
    the console hears again, those still unheard are unreachable from now: each gets the whole
    failover time from the last of its fellows heard again to be heard itself, rather than none
    when it is not the first to call back."""
    seen = back.last_heartbeat_at or back.registered_at
    window = timedelta(seconds=settings.HOST_HEARTBEAT_GRACE_SECONDS)
    Host.objects.filter(
        status=Host.Status.UNREACHABLE,
        last_heartbeat_at__gte=seen - window,
        last_heartbeat_at__lte=seen + window,
    ).update(unreachable_since=now)


# --- the watchdog ----------------------------------------------------------------------


def mark_silent_hosts_unreachable(grace_seconds: float | None = None) -> list[Host]:
    """Hosts whose agent has not been heard of for the grace period become `unreachable`.
    Compare-and-swap: a heartbeat (or another watchdog) that came first wins."""
    grace = settings.HOST_HEARTBEAT_GRACE_SECONDS if grace_seconds is None else grace_seconds
    now = timezone.now()
    cutoff = now - timedelta(seconds=grace)
    silent = Host.objects.exclude(status__in=[Host.Status.UNREACHABLE, Host.Status.RETIRED]).filter(
        Q(last_heartbeat_at__lt=cutoff)
        | Q(last_heartbeat_at__isnull=True, registered_at__lt=cutoff)
    )
    marked = []
    for host in silent:
        with transaction.atomic():
            changed = Host.objects.filter(
                pk=host.pk, status=host.status, last_heartbeat_at=host.last_heartbeat_at
            ).update(status=Host.Status.UNREACHABLE, unreachable_since=now, status_changed_at=now)
            if not changed:
                continue
            seen = host.last_heartbeat_at or host.registered_at
            _event(
                host,
                host.status,
                Host.Status.UNREACHABLE,
                f"no heartbeat for {(now - seen).total_seconds():.0f} s",
            )
        log.warning("host %s is unreachable (was %s)", host.name, host.status)
        marked.append(host)
    return marked


def hosts_unreachable_longer_than(seconds: float) -> QuerySet[Host]:
    """Hosts unreachable for at least `seconds`: what instance failover acts on (see
    settings.HOST_FAILOVER_SECONDS)."""
    cutoff = timezone.now() - timedelta(seconds=seconds)
    return Host.objects.filter(status=Host.Status.UNREACHABLE, unreachable_since__lte=cutoff)


def hosts_to_fail_over(now: datetime | None = None) -> list[Host]:
    """Hosts unreachable for HOST_FAILOVER_SECONDS whose instances should fail over, less those
    that went silent together with HOST_FAILOVER_SILENT_SHARE of the fleet (or more): when that
    many hosts stop being heard within one grace period of each other, what failed is most
    likely the console's side (its web processes, its network), not every host at once, so
    their instances are kept until the hosts are heard again, or one of them stays silent for
    the failover time after the others came back (record_heartbeat restarts its clock). A fleet
    of one host cannot tell and fails over as before."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.HOST_FAILOVER_SECONDS)
    fleet = Host.objects.exclude(status=Host.Status.RETIRED).count()
    silent = list(Host.objects.filter(status=Host.Status.UNREACHABLE))
    window = timedelta(seconds=settings.HOST_HEARTBEAT_GRACE_SECONDS)
    chosen, held = [], []
    for host in silent:
        if host.unreachable_since is None or host.unreachable_since > cutoff:
            continue
        seen = host.last_heartbeat_at or host.registered_at
        together = [
            other
            for other in silent
            if abs((other.last_heartbeat_at or other.registered_at) - seen) <= window
        ]
        if fleet > 1 and len(together) >= max(2, settings.HOST_FAILOVER_SILENT_SHARE * fleet):
            held.append(host)
        else:
            chosen.append(host)
    if held:
        names = ", ".join(host.name for host in held[:5]) + (", …" if len(held) > 5 else "")
        log.warning(
            "not failing over %s: %d of %d hosts went silent together (the console's outage, "
            "most likely)", names, len(held), fleet,
        )  # fmt: skip
    return chosen


# --- operators -------------------------------------------------------------------------


def report(host: Host, message: str) -> HostEvent:
    """Something on the host that its operators should look at (no change of status): a host
    event, on the fleet page and in the admin, and a warning in the log."""
    log.warning("host %s: %s", host.name, message)
    return _event(host, host.status, host.status, message)


# what the audit log keeps of an operator's choice for a host
HOST_STATUS_FIELDS = ["admin_status", "status", "operator_note"]


def announce_to_tenants(host: Host, status: str, note: str) -> None:
    """Once committed, a `host.maintenance` notice to each tenant with instances holding GPUs
    on `host`, naming them (console.notices)."""
    said = f" ({note})" if note else ""
    _tell_tenants(
        host,
        "host.maintenance",
        lambda names: (
            f"Host {host.name} is going into {status}{said}; your instance(s) on it: "
            f"{', '.join(names)}."
        ),
        {"host": host.name, "status": status, "note": note},
    )


def _tell_tenants(host: Host, kind: str, text, data: dict) -> None:
    """Once committed, a `kind` notice to each tenant with instances holding GPUs on `host`:
    `text(names)` says it with the names of its instances, which `data` gets too."""
    claim = Gpu.claims.rel.related_model
    names: dict[int, list[str]] = {}
    for tenant_id, name in (
        claim.objects.filter(gpu__host=host, allocation__released_at__isnull=True)
        .values_list("allocation__instance__tenant_id", "allocation__instance__name")
        .order_by("allocation__instance__tenant_id", "allocation__instance__name")
        .distinct()
    ):
        names.setdefault(tenant_id, []).append(name)
    for tenant_id, instances in names.items():
        told = {
            "tenant": tenant_id,
            "kind": kind,
            "subject": host,
            "text": text(instances),
            "data": {**data, "instances": instances},
        }
        transaction.on_commit(lambda told=told: notice.send(sender=__name__, **told))


def set_host_status(host: Host, status: str, actor=None, message: str = "", note: str = "") -> Host:
    """An operator's choice: active (uncordon), cordoned, draining, maintenance, retired,
    with a `note` for the tenants whose instances are on the host (kept until the next
    choice). While a host is unreachable the choice is kept and takes effect when it comes
    back."""
    if status not in Host.OPERATOR_STATUSES:
        allowed = ", ".join(Host.OPERATOR_STATUSES)
        raise ValidationError({"status": f"An operator can set {allowed}; not {status!r}."})
    with transaction.atomic():
        locked = locks.host(host.pk)
        if locked.admin_status == status:
            return locked
        if not locked.can_become(status):
            raise ValidationError(
                f"{locked.name} is {locked.admin_status}; it cannot become {status}."
            )
        if status == Host.Status.RETIRED:
            held = locked.gpus.aggregate(held=Count("claims"))["held"]
            if held:
                raise ValidationError(
                    f"{locked.name} still holds {held} GPU slice(s); drain it and wait for its "
                    "instances to leave before retiring it."
                )
        now = timezone.now()
        keep_unreachable = (
            locked.status == Host.Status.UNREACHABLE and status != Host.Status.RETIRED
        )
        new_status = Host.Status.UNREACHABLE if keep_unreachable else status
        changed = Host.objects.filter(
            pk=locked.pk, status=locked.status, admin_status=locked.admin_status
        ).update(
            admin_status=status,
            status=new_status,
            status_changed_at=now if new_status != locked.status else locked.status_changed_at,
            unreachable_since=locked.unreachable_since if keep_unreachable else None,
            operator_note=note,
        )
        if not changed:
            raise ValidationError(f"{locked.name} changed meanwhile; try again.")
        text = message or f"operator set {status}"
        if note:
            text += f": {note}"
        if keep_unreachable:
            text += " (takes effect when the host is reachable again)"
        _event(locked, locked.status, new_status, text, actor=actor)
        if status in Host.ANNOUNCED:
            announce_to_tenants(locked, status, note)
        audit.record(
            "host.set_status",
            locked,
            before=audit.snapshot(locked, HOST_STATUS_FIELDS),
            after={"admin_status": status, "status": new_status, "operator_note": note},
        )
    host.refresh_from_db()
    return host


def set_gpu_mode(gpu: Gpu, mode: str, actor=None) -> Gpu:
    """Change how a GPU is partitioned: only while nothing is allocated on it. The GPU is
    fenced off first (placement takes nothing on it), then its agent switches it, outside any
    transaction, then the control plane follows; a refusal lifts the fence."""
    if mode not in Mode.values:
        raise ValidationError(
            {"mode": f"Unknown mode {mode!r}; use one of {', '.join(Mode.values)}."}
        )
    with transaction.atomic():
        locked = locks.gpu(gpu.pk)
        if locked.mode == mode:
            return locked
        if mode == Mode.MIG and not locked.model.mig_capable:
            raise ValidationError(f"{locked.model.name} does not support MIG.")
        if locked.host.status == Host.Status.RETIRED:
            raise ValidationError(f"{locked.host.name} is retired.")
        held = locked.claims.count()
        if held:
            raise ValidationError(
                f"{locked} has {held} slice(s) allocated; its mode can change only when nothing "
                "is allocated on it."
            )
        Gpu.objects.filter(pk=locked.pk).update(mode_changing_to=mode)
    try:
        reported = _switch_on_agent(locked, mode)
    except ValidationError:
        Gpu.objects.filter(pk=locked.pk).update(mode_changing_to="")
        raise
    locked.mode = mode
    locked.mig_enabled = bool(reported.get("mig_enabled", mode == Mode.MIG))
    locked.mode_changing_to = ""
    with transaction.atomic():
        locked.save(update_fields=["mode", "mig_enabled", "mode_changing_to"])
        # The inventory changed on the agent: take the next heartbeat's as it comes.
        Host.objects.filter(pk=locked.host_id).update(inventory_digest="")
    who = actor.get_username() if actor is not None else SYSTEM
    log.info("%s: mode set to %s by %s", locked, mode, who)
    return locked


def _switch_on_agent(gpu: Gpu, mode: str) -> dict:
    """The agent's answer to repartitioning the GPU, or a ValidationError saying why not."""
    host = gpu.host
    try:
        return agent_client.set_gpu_mode(host, gpu.index, mode)
    except agent_client.AgentRejected as exc:
        if exc.status in (404, 405):
            raise ValidationError(
                f"The agent of {host.name} (version {host.agent_version or '?'}) "
                "cannot change GPU modes; restart it with the new --mode."
            ) from exc
        raise ValidationError(f"The agent refused: {exc}") from exc
    except agent_client.AgentUnavailable as exc:
        raise ValidationError(
            f"The agent of {host.name} did not answer; try again later. ({exc})"
        ) from exc
