"""Who a host is: the secret it shares with its agent, and the address the console calls it at.

The address is fixed at the join; only an operator changes it (`change_address`), or a new
join. The secret is rotated on demand (`rotate_secret`), on a schedule (`rotate_due`), or
revoked (a rotation that leaves the old secret no grace). A new secret goes to the agent only
over its control plane, at the host's fixed address, authenticated with the current secret
(agent_client.put_host_secret): it is first kept as the host's *pending* secret, so that an
agent that took it while its answer was lost is not locked out (its first call with it makes it
the current one), then made current once the agent took it; the old one stays valid for
HOST_SECRET_GRACE_SECONDS (none on a revoke) on both sides. A thief holding the old secret
never receives the new one: it goes to the host's address, not to whoever calls."""

import hmac
import logging
import secrets
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from console.audit import recorder as audit
from console.fleet import agent_client, locks
from console.fleet.addresses import address_problem, url_is_loopback
from console.fleet.models import Host, HostEvent, hash_secret, open_secret, seal_secret

log = logging.getLogger(__name__)

SYSTEM = "system"
SECRET_COLUMNS = (
    "pk", "sealed_secret", "previous_sealed_secret", "previous_secret_until",
    "pending_sealed_secret",
)  # fmt: skip


def _event(host: Host, message: str, actor=None) -> HostEvent:
    return HostEvent.objects.create(
        host=host,
        actor=actor,
        actor_label=actor.get_username() if actor is not None else SYSTEM,
        from_status=host.status,
        to_status=host.status,
        message=message[:300],
    )


def _same(sealed: str, given: bytes) -> bool:
    return bool(sealed) and hmac.compare_digest(open_secret(sealed).encode(), given)


def rows_for_secret(secret: str, *fields: str) -> list[tuple]:
    """`(pk, *fields)` rows (as `values_list`, one per related row) of the host whose agent
    holds `secret`: its current secret, the one before it while its grace lasts, or the
    pending one (which this call makes current: only the agent was handed it). One query in
    the usual case; empty when no host holds it."""
    hashed = hash_secret(secret)
    rows = list(
        Host.objects.filter(
            Q(secret_hash=hashed) | Q(previous_secret_hash=hashed) | Q(pending_secret_hash=hashed)
        ).values_list(*SECRET_COLUMNS, *fields)
    )
    if not rows:
        return []
    pk, current, previous, until, pending = rows[0][: len(SECRET_COLUMNS)]
    given = secret.encode()
    in_grace = until is not None and until > timezone.now()
    if not (_same(current, given) or (in_grace and _same(previous, given))):
        if not _same(pending, given):
            return []
        _promote(pk, hashed, settings.HOST_SECRET_GRACE_SECONDS, "the agent called with it")
    return [(pk, *row[len(SECRET_COLUMNS) :]) for row in rows if row[0] == pk]


def _promote(pk: int, hashed: str, grace: float, why: str) -> bool:
    """Make the host's pending secret (of hash `hashed`) its current one, the current one valid
    `grace` seconds more; a revoke (no grace) also ends the grace of one promoted already.
    False when neither is that secret any more (another rotation came since)."""
    now = timezone.now()
    with transaction.atomic():
        locked = locks.host(pk)
        if locked.pending_secret_hash == hashed:
            Host.objects.filter(pk=pk).update(
                sealed_secret=locked.pending_sealed_secret,
                secret_hash=hashed,
                previous_sealed_secret=locked.sealed_secret,
                previous_secret_hash=locked.secret_hash,
                previous_secret_until=now + timedelta(seconds=grace) if grace > 0 else None,
                pending_sealed_secret="",
                pending_secret_hash="",
                secret_rotated_at=now,
            )
            _event(locked, f"new host secret in use ({why})")
        elif locked.secret_hash != hashed:
            return False
        if grace <= 0:
            Host.objects.filter(pk=pk).update(
                previous_sealed_secret="", previous_secret_hash="", previous_secret_until=None
            )
    return True


def _drop_pending(pk: int, hashed: str) -> None:
    Host.objects.filter(pk=pk, pending_secret_hash=hashed).update(
        pending_sealed_secret="", pending_secret_hash=""
    )


def rotate_secret(host: Host, actor=None, *, revoke: bool = False) -> Host:
    """Give the host's agent a new secret and make it the host's. A rotation keeps the old one
    valid HOST_SECRET_GRACE_SECONDS; a revoke does not (for a leaked secret). ValidationError
    saying what happened when the agent does not take it: the old secret stays in use."""
    verb = "revoke" if revoke else "rotation"
    grace = 0.0 if revoke else settings.HOST_SECRET_GRACE_SECONDS
    with transaction.atomic():
        locked = locks.host(host.pk)
        if locked.status == Host.Status.RETIRED:
            raise ValidationError(f"{locked.name} is retired: its agent is gone.")
        # A pending secret may be with the agent already (a push whose answer was lost, or a
        # rotation running beside this one): hand that one again rather than another.
        if locked.pending_secret_hash:
            new = open_secret(locked.pending_sealed_secret)
        else:
            new = secrets.token_urlsafe(32)
            Host.objects.filter(pk=locked.pk).update(
                pending_sealed_secret=seal_secret(new), pending_secret_hash=hash_secret(new)
            )
    hashed = hash_secret(new)
    try:
        agent_client.put_host_secret(locked, new, grace)
    except agent_client.AgentRejected as exc:
        _event(locked, f"secret {verb} refused by the agent: {exc.message}", actor)
        if exc.status == 401:  # it holds another secret: the pending one, most likely
            raise ValidationError(
                f"The agent of {locked.name} no longer takes the current secret: it holds the "
                "new one already, most likely, and the console takes it at the agent's next "
                "call. Look at the host's events in a minute."
            ) from exc
        _drop_pending(locked.pk, hashed)
        raise ValidationError(
            f"The agent of {locked.name} refused the new secret ({exc.message}); the old one "
            "stays in use. An agent older than this console cannot take one: upgrade it."
        ) from exc
    except agent_client.AgentUnavailable as exc:
        _event(locked, f"secret {verb} failed: the agent did not answer ({exc.message})", actor)
        raise ValidationError(
            f"The agent of {locked.name} did not answer at {locked.address}, so the old secret "
            "stays in use (should the agent have taken the new one, the console takes it at its "
            "next call). Try again when the host is reachable; a host that is lost for good "
            "joins again with a new join token."
        ) from exc
    if not _promote(locked.pk, hashed, grace, f"{verb} by {_who(actor)}"):
        raise ValidationError(f"{locked.name}'s secret changed meanwhile; try again.")
    with transaction.atomic():
        text = f"host secret {'revoked: the old one no longer works' if revoke else 'rotated'}"
        if not revoke:
            text += f"; the old one works {grace:.0f} s more"
        _event(locked, text, actor)
        audit.record(
            f"host.{'revoke' if revoke else 'rotate'}_secret",
            locked,
            after={"grace_seconds": grace},
        )
    log.info("host %s: secret %s by %s", locked.name, verb, _who(actor))
    locked.refresh_from_db()
    return locked


def _who(actor) -> str:
    return actor.get_username() if actor is not None else SYSTEM


def due_for_rotation() -> list[int]:
    """Hosts whose secret is older than HOST_SECRET_ROTATION_DAYS (none when it is 0), and
    heard from: an unreachable agent could not take a new one."""
    days = settings.HOST_SECRET_ROTATION_DAYS
    if days <= 0:
        return []
    cutoff = timezone.now() - timedelta(days=days)
    return list(
        Host.objects.filter(secret_rotated_at__lt=cutoff)
        .exclude(status__in=(Host.Status.UNREACHABLE, Host.Status.RETIRED))
        .values_list("pk", flat=True)
    )


def rotate_scheduled(host_pk: int) -> bool:
    """The schedule's rotation of one host (a task): False when it is no longer due or the
    agent did not take it (a host event says why; the next round tries again)."""
    if host_pk not in due_for_rotation():
        return False
    host = Host.objects.filter(pk=host_pk).first()
    if host is None:
        return False
    try:
        rotate_secret(host)
    except ValidationError:
        return False
    return True


def address_refusal(host: Host, address: str) -> str | None:
    """Why an operator may not move `host` to `address` (None: it may)."""
    return address_problem(address, local=url_is_loopback(host.address))


def change_address(host: Host, address: str, actor) -> Host:
    """An operator moves the host: the console calls its agent at `address` from now on.
    Refused (ValidationError on `address`) where no agent may be (console.fleet.addresses):
    loopback only for a host whose agent is on this machine already."""
    address = address.strip().rstrip("/")
    problem = address_refusal(host, address)
    if problem:
        raise ValidationError({"address": f"{address!r}: {problem}"})
    with transaction.atomic():
        locked = locks.host(host.pk)
        if locked.address == address:
            return locked
        Host.objects.filter(pk=locked.pk).update(address=address, reported_address="")
        _event(locked, f"address changed by the operator: {locked.address} -> {address}", actor)
        audit.record(
            "host.change_address",
            locked,
            before={"address": locked.address},
            after={"address": address},
        )
    host.refresh_from_db()
    return host
