"""Delivering notices in-process: the signed webhook's body and signature, retries and the
delivery log, Slack-compatible and email channels, secret rotation, tenants kept apart."""

import json
import time
from datetime import timedelta

import pytest
import time_machine
from django.core import mail
from django.utils import timezone

from console.notices import notice
from console.notifications import services, signing
from console.notifications.models import Attempt, Delivery, Notice
from tests.factories import TenantFactory
from tests.instances.conftest import Catalog
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.django_db


def webhook(tenant, url, kinds=("instance.failed",), name="hook"):
    return services.create_endpoint(
        tenant, name=name, channel="webhook", target=url, kinds=list(kinds)
    )


def deliver_all() -> list[Attempt]:
    """Attempt every pending delivery that is due, as the worker would."""
    due = Delivery.objects.filter(state="pending", next_attempt_at__lte=timezone.now())
    return [services.attempt_delivery(pk) for pk in due.values_list("pk", flat=True)]


def test_webhook_is_delivered_signed_with_the_event(
    tenant, receiver, private_allowed, django_capture_on_commit_callbacks
):
    endpoint, secret = webhook(tenant, receiver.url)
    with django_capture_on_commit_callbacks(execute=True) as queued:
        notice.send(
            sender=__name__,
            tenant=tenant,
            kind="instance.failed",
            subject=endpoint,  # any model row: its type, id and name
            text="gpu-a failed: ran out of its memory",
            data={"instance_id": 999, "reason": "oom_killed"},
        )
    assert len(queued) == 1  # the delivery's task, queued after the commit
    [attempt] = deliver_all()
    [request] = receiver.requests
    body = json.loads(request.body)
    recorded = Notice.objects.get()
    assert body["event_id"] == str(recorded.event_id) == request.headers["Gpucloud-Event-Id"]
    assert body["type"] == "instance.failed"
    assert body["tenant"] == {"id": tenant.pk, "slug": "acme", "name": "Acme AI"}
    assert body["object"] == {"type": "endpoint", "id": endpoint.pk, "name": "hook"}
    assert body["text"] == "gpu-a failed: ran out of its memory"
    assert body["data"]["reason"] == "oom_killed" and body["time"].endswith("Z")
    header = request.headers[signing.HEADER]
    assert signing.verify(request.body, header, secret)
    assert not signing.verify(request.body, header, signing.new_secret())
    assert not signing.verify(request.body + b" ", header, secret)
    assert attempt.ok and attempt.status_code == 200 and attempt.number == 1
    assert '"received": true' in attempt.response_excerpt
    assert Delivery.objects.get().state == "delivered"


def test_the_signature_carries_its_time_against_replay(tenant, receiver, private_allowed):
    _, secret = webhook(tenant, receiver.url)
    services.record_notice(tenant, "instance.failed", text="x")
    before = int(time.time())
    deliver_all()
    request = receiver.requests[0]
    header = request.headers[signing.HEADER]
    stamp = int(dict(p.split("=", 1) for p in header.split(","))["t"])
    assert before <= stamp <= int(time.time())
    assert signing.verify(request.body, header, secret, now=stamp + 299)
    assert not signing.verify(request.body, header, secret, now=stamp + 301)  # a replay
    forged = header.replace(f"t={stamp}", f"t={stamp + 600}")
    assert not signing.verify(request.body, forged, secret, now=stamp + 600)


def test_a_500_is_retried_with_backoff_and_both_attempts_are_logged(
    tenant, receiver, private_allowed
):
    private_allowed.NOTIFICATIONS_RETRY_SECONDS = 30
    endpoint, secret = webhook(tenant, receiver.url)
    receiver.statuses = [500]
    services.record_notice(tenant, "instance.failed", text="x")
    [first] = deliver_all()
    delivery = Delivery.objects.get()
    assert (first.ok, first.status_code, first.error) == (False, 500, "answered 500")
    assert "receiver is down" in first.response_excerpt
    assert delivery.state == "pending" and delivery.attempts == 1
    wait = delivery.next_attempt_at - first.at
    assert timedelta(seconds=29) < wait < timedelta(seconds=32)
    assert deliver_all() == []  # not due yet
    with time_machine.travel(delivery.next_attempt_at + timedelta(seconds=1)):
        assert services.queue_due() == 1
        [second] = deliver_all()
    assert second.ok and second.number == 2
    assert Delivery.objects.get().state == "delivered"
    first_body, second_body = (r.body for r in receiver.requests)
    assert first_body == second_body  # the same event, signed again at each attempt
    assert all(signing.verify(r.body, r.headers[signing.HEADER], secret) for r in receiver.requests)
    assert [r.headers["Gpucloud-Attempt"] for r in receiver.requests] == ["1", "2"]
    log = list(endpoint.attempts.values_list("number", "status_code", "ok"))
    assert log == [(2, 200, True), (1, 500, False)]


def test_backoff_doubles_up_to_its_cap_and_gives_up_after_the_window(
    tenant, private_allowed, receiver
):
    private_allowed.NOTIFICATIONS_RETRY_SECONDS = 30
    private_allowed.NOTIFICATIONS_RETRY_MAX_SECONDS = 3600
    assert [services.backoff(n).total_seconds() for n in (1, 2, 3, 8, 20)] == [
        30, 60, 120, 3600, 3600,
    ]  # fmt: skip
    webhook(tenant, receiver.url)
    receiver.statuses = [503] * 5
    services.record_notice(tenant, "instance.failed", text="x")
    deliver_all()
    delivery = Delivery.objects.get()
    with time_machine.travel(delivery.created_at + timedelta(hours=24)):
        Delivery.objects.update(next_attempt_at=timezone.now())
        [last] = deliver_all()
    delivery.refresh_from_db()
    assert not last.ok and delivery.state == "failed" and delivery.next_attempt_at is None


def test_slack_compatible_hook_gets_its_text(tenant, receiver, private_allowed):
    services.create_endpoint(
        tenant, name="slack", channel="slack", target=receiver.url, kinds=["budget.threshold"]
    )
    services.record_notice(tenant, "budget.threshold", text="Spending reached 80%.")
    deliver_all()
    [request] = receiver.requests
    assert json.loads(request.body) == {
        "text": "*Spending crossed a budget threshold* (Acme AI): Spending reached 80%."
    }
    assert signing.HEADER not in request.headers


def test_email_goes_to_its_address(tenant):
    services.create_endpoint(
        tenant, name="ops", channel="email", target="ops@acme.test", kinds=["invoice.issued"]
    )
    services.record_notice(tenant, "invoice.issued", text="Invoice GC-2026-000001 was issued.")
    [attempt] = deliver_all()
    [message] = mail.outbox
    assert message.to == ["ops@acme.test"]
    assert message.subject == "[gpucloud] Acme AI: An invoice was issued"
    assert "Invoice GC-2026-000001 was issued." in message.body
    assert attempt.ok and attempt.response_excerpt == "sent to ops@acme.test"


def test_only_subscribed_enabled_endpoints_of_the_tenant_receive_it(
    tenant, receiver, private_allowed
):
    other = TenantFactory(slug="globex")
    webhook(other, receiver.url, name="theirs")  # same kind, another tenant
    webhook(tenant, receiver.url, kinds=["invoice.issued"], name="other-kind")
    off, _ = webhook(tenant, receiver.url, name="off")
    services.update_endpoint(off, enabled=False)
    mine, _ = webhook(tenant, receiver.url, name="mine")
    services.record_notice(tenant, "instance.failed", text="x")
    assert list(Delivery.objects.values_list("endpoint__name", flat=True)) == ["mine"]
    deliver_all()
    assert [json.loads(r.body)["tenant"]["slug"] for r in receiver.requests] == ["acme"]
    assert services.record_notice(other, "snapshot.done", text="x") is None  # nobody wants it


def test_an_unknown_kind_is_refused_and_the_receiver_never_raises(tenant, caplog):
    with pytest.raises(ValueError):
        services.record_notice(tenant, "made.up", text="x")
    notice.send(sender=__name__, tenant=tenant, kind="made.up", text="x")  # logged, not raised
    assert "could not record the made.up notice" in caplog.text


def test_rotation_signs_with_both_secrets_through_the_grace_period(
    tenant, receiver, private_allowed
):
    endpoint, old = webhook(tenant, receiver.url)
    new = services.rotate_secret(endpoint)
    assert new != old and new.startswith("whsec_")
    services.record_notice(tenant, "instance.failed", text="x")
    deliver_all()
    request = receiver.requests[-1]
    header = request.headers[signing.HEADER]
    assert header.count("v1=") == 2
    assert signing.verify(request.body, header, new) and signing.verify(request.body, header, old)
    with time_machine.travel(endpoint.previous_secret_expires_at + timedelta(seconds=1)):
        services.record_notice(tenant, "instance.failed", text="y")
        deliver_all()
        request = receiver.requests[-1]
        header = request.headers[signing.HEADER]
        assert header.count("v1=") == 1
        assert signing.verify(request.body, header, new)
        assert not signing.verify(request.body, header, old)


def test_secrets_are_sealed_at_rest(tenant, receiver, private_allowed):
    endpoint, secret = webhook(tenant, receiver.url)
    endpoint.refresh_from_db()
    assert secret not in endpoint.secret_sealed
    assert signing.unseal(endpoint.secret_sealed) == secret


def test_a_claimed_delivery_is_not_attempted_twice(tenant, receiver, private_allowed):
    webhook(tenant, receiver.url)
    services.record_notice(tenant, "instance.failed", text="x")
    pk = Delivery.objects.get().pk
    assert services.attempt_delivery(pk) is not None
    assert services.attempt_delivery(pk) is None  # delivered: a redelivered task does nothing
    assert len(receiver.requests) == 1


def test_a_failed_instance_notice_carries_its_last_log_lines(tenant, receiver, private_allowed):
    """No host holds the instance's logs here: the notice says so with an empty tail."""
    webhook(tenant, receiver.url)
    services.record_notice(tenant, "instance.failed", text="x", data={"instance_id": 12345})
    deliver_all()
    assert json.loads(receiver.requests[0].body)["data"]["log_tail"] == []


def test_an_instances_notice_links_to_its_page(tenant, settings):
    settings.CONSOLE_URL = "https://console.acme.test/"
    box = make_instance(Catalog(), tenant, name="box")
    services.create_endpoint(
        tenant, name="ops", channel="email", target="ops@acme.test", kinds=["instance.failed"]
    )
    services.record_notice(tenant, "instance.failed", subject=box, text="box failed.")
    deliver_all()
    [message] = mail.outbox
    page = f"https://console.acme.test/instances/{box.pk}/"
    assert f"Open it on the console: {page}" in message.body
    assert Notice.objects.get().subject == {
        "type": "instance", "id": box.pk, "name": "box", "url": page
    }  # fmt: skip
