"""How a notice is told on each channel: the signed webhook's JSON, the Slack-compatible
message, the email. ``send`` makes one attempt and answers its outcome; it never raises for
what the far end did."""

import json
import smtplib
import time
from dataclasses import dataclass

import httpx
from django.conf import settings
from django.core.mail import send_mail
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from console.notices import KINDS
from console.notifications import outbound, signing
from console.notifications.models import TEST_KIND, Endpoint, Notice

LABELS = {**KINDS, TEST_KIND: "A test notification"}


@dataclass(frozen=True)
class Outcome:
    ok: bool
    status_code: int | None = None
    latency_ms: int = 0
    excerpt: str = ""
    error: str = ""
    final: bool = False  # refused outright: retrying cannot help


def payload(notice: Notice) -> dict:
    """The signed webhook's body."""
    tenant = notice.tenant
    return {
        "event_id": str(notice.event_id),
        "type": notice.kind,
        "time": notice.created_at.isoformat().replace("+00:00", "Z"),
        "tenant": {"id": tenant.pk, "slug": tenant.slug, "name": tenant.name},
        "object": notice.subject,
        "text": notice.text,
        "data": notice.data,
    }


def body_of(notice: Notice) -> bytes:
    return json.dumps(payload(notice), cls=DjangoJSONEncoder, separators=(",", ":")).encode()


def _page(notice: Notice) -> str:
    """The console page of the notice's object, if it has one."""
    return (notice.subject or {}).get("url", "")


def slack_text(notice: Notice) -> str:
    text = f"*{LABELS.get(notice.kind, notice.kind)}* ({notice.tenant.name}): {notice.text}"
    return f"{text} <{_page(notice)}|Open>" if _page(notice) else text


def email_message(notice: Notice) -> tuple[str, str]:
    label = LABELS.get(notice.kind, notice.kind)
    subject = f"[gpucloud] {notice.tenant.name}: {label}"
    lines = [notice.text, ""]
    for line in notice.data.get("log_tail", []):
        lines.append(f"    {line}")
    if _page(notice):
        lines += ["", f"Open it on the console: {_page(notice)}"]
    lines += [
        "",
        f"Event {notice.event_id} ({notice.kind}) at {notice.created_at:%Y-%m-%d %H:%M:%S} UTC.",
        "You receive this because an admin of the tenant subscribed this address to it on the "
        "console's Notifications page.",
        "",
        "-- gpucloud",
    ]
    return subject, "\n".join(lines)


def webhook_secrets(endpoint: Endpoint) -> list[str]:
    """The secrets that sign now: the current one, and the previous one within its grace."""
    found = [signing.unseal(endpoint.secret_sealed)]
    expires = endpoint.previous_secret_expires_at
    if endpoint.previous_secret_sealed and expires and expires > timezone.now():
        found.append(signing.unseal(endpoint.previous_secret_sealed))
    return found


def _post(url: str, body: bytes, headers: dict[str, str]) -> Outcome:
    try:
        answer = outbound.post(url, body, headers)
    except outbound.AddressRefused as exc:
        return Outcome(False, error=f"refused: {exc}", final=True)
    except (httpx.HTTPError, OSError) as exc:
        return Outcome(False, error=f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__)
    return Outcome(
        200 <= answer.status_code < 300,
        answer.status_code,
        answer.latency_ms,
        answer.excerpt,
        "" if answer.status_code < 300 else f"answered {answer.status_code}",
    )


def _email(endpoint: Endpoint, notice: Notice) -> Outcome:
    subject, text = email_message(notice)
    started = time.monotonic()
    try:
        send_mail(subject, text, settings.DEFAULT_FROM_EMAIL, [endpoint.target])
    except (smtplib.SMTPException, OSError) as exc:
        return Outcome(False, error=f"{type(exc).__name__}: {exc}"[:500])
    latency_ms = int((time.monotonic() - started) * 1000)
    return Outcome(True, latency_ms=latency_ms, excerpt=f"sent to {endpoint.target}")


def send(endpoint: Endpoint, notice: Notice, attempt: int) -> Outcome:
    """One attempt of telling `endpoint` of `notice`."""
    if endpoint.channel == Endpoint.Channel.EMAIL:
        return _email(endpoint, notice)
    if endpoint.channel == Endpoint.Channel.SLACK:
        body = json.dumps({"text": slack_text(notice)}).encode()
        return _post(endpoint.target, body, {})
    body = body_of(notice)
    headers = {
        signing.HEADER: signing.header(body, webhook_secrets(endpoint)),
        "Gpucloud-Event-Id": str(notice.event_id),
        "Gpucloud-Event-Type": notice.kind,
        "Gpucloud-Attempt": str(attempt),
    }
    return _post(endpoint.target, body, headers)
