"""Notifications' actions: tenants' admins manage endpoints (add, change, delete, rotate a
webhook's secret, send a test); the `notice` receiver records a notice and its deliveries;
the worker attempts a delivery; the beat's sweep queues what is due again.

A delivery is attempted once at once (queued after the notice's commit), then again after
NOTIFICATIONS_RETRY_SECONDS, doubling up to NOTIFICATIONS_RETRY_MAX_SECONDS, for
NOTIFICATIONS_RETRY_HOURS after the notice. What is due lives in the delivery's row
(``next_attempt_at``), not in the broker: the sweep queues it again, so a lost task or a
restarted worker delays a delivery by one sweep at most. An attempt claims its delivery with a
compare-and-swap that moves ``next_attempt_at`` past the attempt's lease, so two workers never
attempt the same delivery at once."""

import logging
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import F
from django.urls import reverse
from django.utils import timezone

from accounts.models import Tenant
from console.celery import enqueue_on_commit
from console.errors import DomainError, ErrorCode
from console.notices import KINDS
from console.notifications import channels, locks, outbound, signing
from console.notifications.models import TEST_KIND, Attempt, Delivery, Endpoint, Notice

log = logging.getLogger(__name__)

DELIVER_TASK = "console.notifications.tasks.deliver"
LOG_TAIL_LINES = 20
SWEEP_BATCH = 500


class NotAWebhook(DomainError):
    code = ErrorCode.NOT_A_WEBHOOK


# --- endpoints ----------------------------------------------------------------------------


def check_target(channel: str, target: str) -> None:
    """ValidationError on `target` when `channel` cannot use it: an email address, or a URL
    that notifications may reach (a host that resolves now is checked now; every delivery
    checks it again)."""
    if channel == Endpoint.Channel.EMAIL:
        try:
            validate_email(target)
        except ValidationError:
            raise ValidationError({"target": "Enter a valid email address."}) from None
        return
    why = outbound.url_refusal(target)
    if why is None:
        host, port = _host_port(target)
        try:
            outbound.resolve(host, port)
        except outbound.AddressRefused as exc:
            why = str(exc)
        except OSError:
            why = None  # not resolvable yet: each delivery resolves it again
    if why:
        raise ValidationError({"target": f"This URL cannot be used: {why}."})


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def check_kinds(kinds: list[str]) -> list[str]:
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValidationError({"kinds": f"Unknown kind(s): {', '.join(unknown)}."})
    if not kinds:
        raise ValidationError({"kinds": "Choose at least one kind of notice."})
    return [kind for kind in KINDS if kind in kinds]


def _check_name(tenant_id: int, name: str, exclude_pk: int | None = None) -> None:
    taken = Endpoint.objects.filter(tenant_id=tenant_id, name=name).exclude(pk=exclude_pk)
    if taken.exists():
        raise ValidationError({"name": "The tenant has an endpoint of that name already."})


def create_endpoint(
    tenant: Tenant, *, name: str, channel: str, target: str, kinds: list[str], enabled=True
) -> tuple[Endpoint, str | None]:
    """A new endpoint; for a signed webhook also its secret, which is shown this once."""
    if channel not in Endpoint.Channel.values:
        raise ValidationError({"channel": f"Choose one of {', '.join(Endpoint.Channel.values)}."})
    check_target(channel, target)
    kinds = check_kinds(kinds)
    secret = signing.new_secret() if channel == Endpoint.Channel.WEBHOOK else None
    with transaction.atomic():
        _check_name(tenant.pk, name)
        endpoint = Endpoint.objects.create(
            tenant=tenant,
            name=name,
            channel=channel,
            target=target,
            kinds=kinds,
            enabled=enabled,
            secret_sealed=signing.seal(secret) if secret else "",
        )
    return endpoint, secret


def update_endpoint(endpoint: Endpoint, **changes) -> Endpoint:
    """Change an endpoint's name, target, kinds or enabled (its channel stays)."""
    if "target" in changes:
        check_target(endpoint.channel, changes["target"])
    if "kinds" in changes:
        changes["kinds"] = check_kinds(changes["kinds"])
    allowed = {"name", "target", "kinds", "enabled"}
    unknown = set(changes) - allowed
    if unknown:
        raise ValueError(f"cannot change {', '.join(sorted(unknown))}")
    with transaction.atomic():
        if "name" in changes:
            _check_name(endpoint.tenant_id, changes["name"], exclude_pk=endpoint.pk)
        Endpoint.objects.filter(pk=endpoint.pk).update(**changes, updated_at=timezone.now())
    endpoint.refresh_from_db()
    return endpoint


def delete_endpoint(endpoint: Endpoint) -> None:
    """The endpoint, its pending deliveries and its log go."""
    endpoint.delete()


def rotate_secret(endpoint: Endpoint, now: datetime | None = None) -> str:
    """A new signing secret for a webhook, shown this once. The one it replaces keeps
    signing too (a second ``v1``) for NOTIFICATIONS_SECRET_GRACE_HOURS, so receivers can
    switch over without missing a delivery."""
    if endpoint.channel != Endpoint.Channel.WEBHOOK:
        raise NotAWebhook("Only a signed webhook has a secret to rotate.")
    now = now or timezone.now()
    secret = signing.new_secret()
    grace = timedelta(hours=settings.NOTIFICATIONS_SECRET_GRACE_HOURS)
    with transaction.atomic():
        locked = locks.endpoint(endpoint.pk)
        Endpoint.objects.filter(pk=locked.pk).update(
            secret_sealed=signing.seal(secret),
            previous_secret_sealed=locked.secret_sealed,
            previous_secret_expires_at=now + grace,
            updated_at=now,
        )
    endpoint.refresh_from_db()
    return secret


def send_test(endpoint: Endpoint) -> Delivery:
    """A test notice to this endpoint alone, delivered (and logged) as any other."""
    text = f"A test notification from gpucloud to {endpoint.name}: this endpoint works."
    with transaction.atomic():
        notice = Notice.objects.create(
            tenant_id=endpoint.tenant_id,
            kind=TEST_KIND,
            text=text,
            data={"endpoint": endpoint.pk},
        )
        delivery = Delivery.objects.create(
            notice=notice, endpoint=endpoint, next_attempt_at=notice.created_at
        )
        enqueue_on_commit(DELIVER_TASK, delivery.pk)
    return delivery


# --- notices --------------------------------------------------------------------------------


# the console pages a notice's object has, by its model, where its reader acts on it (keeps an
# idle instance running, reads a failure's events)
PAGES = {"instance": "instances:detail"}


def describe(subject) -> dict | None:
    """What a notice is about, as its receivers are told: type, id, name, and its page's
    address on the console (CONSOLE_URL) where it has one."""
    if subject is None:
        return None
    name = getattr(subject, "name", None) or getattr(subject, "number", None) or str(subject)
    kind = subject._meta.model_name
    described = {"type": kind, "id": subject.pk, "name": name}
    if kind in PAGES and settings.CONSOLE_URL:
        page = reverse(PAGES[kind], args=[subject.pk])
        described["url"] = settings.CONSOLE_URL.rstrip("/") + page
    return described


def record_notice(tenant, kind: str, subject=None, text: str = "", data=None) -> Notice | None:
    """Record a notice for the tenant's endpoints subscribed to `kind`, and queue its
    deliveries once committed. None when no endpoint wants it."""
    if kind not in KINDS:
        raise ValueError(f"unknown notice kind {kind!r}")
    tenant_id = getattr(tenant, "pk", tenant)
    wanted = [
        pk
        for pk, kinds in Endpoint.objects.filter(tenant_id=tenant_id, enabled=True).values_list(
            "pk", "kinds"
        )
        if kind in kinds
    ]
    if not wanted:
        return None
    with transaction.atomic():
        notice = Notice.objects.create(
            tenant_id=tenant_id,
            kind=kind,
            text=(text or KINDS[kind])[:1000],
            data=data or {},
            subject=describe(subject),
        )
        deliveries = Delivery.objects.bulk_create(
            Delivery(notice=notice, endpoint_id=pk, next_attempt_at=notice.created_at)
            for pk in wanted
        )
        for delivery in deliveries:
            enqueue_on_commit(DELIVER_TASK, delivery.pk)
    return notice


def _with_log_tail(notice: Notice) -> None:
    """A failed instance's notice gets the last lines its workload wrote, once (from the
    host that holds its disk; none when that host does not answer)."""
    if notice.kind != "instance.failed" or "log_tail" in notice.data:
        return
    from console.instances import services as instance_services
    from console.instances.models import Instance

    instance = Instance.objects.filter(pk=notice.data.get("instance_id")).first()
    lines: list[str] = []
    if instance is not None:
        try:
            lines = instance_services.instance_logs(instance, LOG_TAIL_LINES)
        except instance_services.LogsUnavailable as exc:
            log.info("no log lines for the notice of instance %s: %s", instance.pk, exc)
    notice.data = {**notice.data, "log_tail": [line[:500] for line in lines]}
    Notice.objects.filter(pk=notice.pk).update(data=notice.data)


# --- deliveries -----------------------------------------------------------------------------


def backoff(attempt: int) -> timedelta:
    """How long after failed attempt number `attempt` (1, 2 …) the next one is due."""
    seconds = settings.NOTIFICATIONS_RETRY_SECONDS * 2 ** (attempt - 1)
    return timedelta(seconds=min(seconds, settings.NOTIFICATIONS_RETRY_MAX_SECONDS))


def lease() -> timedelta:
    """How long a claimed attempt may take before the sweep gives its delivery to another."""
    return timedelta(seconds=settings.NOTIFICATIONS_TIMEOUT_SECONDS * 2 + 60)


def attempt_delivery(delivery_pk: int) -> Attempt | None:
    """Attempt a delivery that is pending and due; None when it is not (done, not due yet,
    or another worker holds it). Records the attempt in the endpoint's log, then marks the
    delivery delivered, failed, or due again after its backoff."""
    now = timezone.now()
    claimed = Delivery.objects.filter(
        pk=delivery_pk, state=Delivery.State.PENDING, next_attempt_at__lte=now
    ).update(next_attempt_at=now + lease(), attempts=F("attempts") + 1)
    if not claimed:
        return None
    delivery = Delivery.objects.select_related("endpoint", "notice__tenant").get(pk=delivery_pk)
    _with_log_tail(delivery.notice)
    outcome = channels.send(delivery.endpoint, delivery.notice, delivery.attempts)
    done = timezone.now()
    window = timedelta(hours=settings.NOTIFICATIONS_RETRY_HOURS)
    retry_at = done + backoff(delivery.attempts)
    if outcome.ok:
        changes = {"state": Delivery.State.DELIVERED, "next_attempt_at": None, "finished_at": done}
    elif outcome.final or retry_at > delivery.created_at + window:
        changes = {"state": Delivery.State.FAILED, "next_attempt_at": None, "finished_at": done}
    else:
        changes = {"next_attempt_at": retry_at}
    with transaction.atomic():
        attempt = Attempt.objects.create(
            delivery=delivery,
            endpoint_id=delivery.endpoint_id,
            number=delivery.attempts,
            at=now,
            ok=outcome.ok,
            status_code=outcome.status_code,
            latency_ms=outcome.latency_ms,
            response_excerpt=outcome.excerpt[:500],
            error=outcome.error[:500],
        )
        Delivery.objects.filter(pk=delivery.pk, state=Delivery.State.PENDING).update(**changes)
    if not outcome.ok:
        log.info(
            "delivery %s to endpoint %s, attempt %s: %s",
            delivery.pk,
            delivery.endpoint_id,
            delivery.attempts,
            outcome.error,
        )
    return attempt


def queue_due(now: datetime | None = None) -> int:
    """The beat's sweep: queue every pending delivery whose next attempt is due (a retry, a
    first attempt whose task was lost, an attempt whose worker died). Answers how many."""
    now = now or timezone.now()
    due = list(
        Delivery.objects.filter(state=Delivery.State.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:SWEEP_BATCH]
    )
    for pk in due:
        enqueue_on_commit(DELIVER_TASK, pk)
    return len(due)
