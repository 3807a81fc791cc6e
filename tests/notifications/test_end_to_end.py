"""Notifications through the real processes: the web process takes the API calls, a real
Celery worker delivers, the beat's sweep retries; a local receiver checks the signatures."""

import json
import time

import httpx
import pytest

from accounts import services as accounts
from accounts.roles import Role
from console import processes
from console.notifications import signing
from console.notifications.models import Attempt
from tests.factories import MembershipFactory, TenantFactory, UserFactory
from tests.harness import running_stack

pytestmark = pytest.mark.integration

ENDPOINTS = "/api/v1/notifications/endpoints/"


@pytest.fixture
def notifying_stack(transactional_db, redis_url, tmp_path, request, monkeypatch):
    """Web, worker and beat as `make run` has them: private addresses allowed, mail into a
    folder; retries after a second, swept every second."""
    monkeypatch.setenv("NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES", "true")
    monkeypatch.setenv("NOTIFICATIONS_RETRY_SECONDS", "1")
    monkeypatch.setenv("NOTIFICATIONS_SWEEP_SECONDS", "1")
    monkeypatch.setenv("EMAIL_BACKEND", "django.core.mail.backends.filebased.EmailBackend")
    monkeypatch.setenv("EMAIL_FILE_PATH", str(tmp_path / "mail"))
    with running_stack(redis_url, tmp_path, request.node) as stack:
        stack.start("beat", processes.beat_cmd(tmp_path)).wait_for_log("beat v")
        yield stack


@pytest.fixture
def admin_api(notifying_stack):
    """An API client of the stack, holding a token of an admin of Acme AI."""
    tenant = TenantFactory(slug="acme", name="Acme AI")
    admin = MembershipFactory(user=UserFactory(), tenant=tenant, role=Role.ADMIN)
    raw_token = accounts.issue_token(admin.user, tenant, "e2e").raw
    return httpx.Client(
        base_url=notifying_stack.url, headers={"Authorization": f"Bearer {raw_token}"}, timeout=30
    )


def add_endpoint(client, name: str, channel: str, target: str, kind: str) -> dict:
    """The endpoint added through the API (its id, and its secret once)."""
    created = client.post(
        ENDPOINTS, json={"name": name, "channel": channel, "target": target, "kinds": [kind]}
    )
    assert created.status_code == 201, created.text
    return created.json()


def wait_until(check, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the condition never held")
        time.sleep(0.2)


def test_webhook_retried_after_a_500_across_a_worker_restart_and_logged(
    notifying_stack, admin_api, receiver
):
    stack, client = notifying_stack, admin_api
    created = add_endpoint(client, "ours", "webhook", receiver.url, "instance.failed")
    endpoint, secret = created["id"], created["secret"]

    receiver.statuses = [500]
    assert client.post(f"{ENDPOINTS}{endpoint}/test/").status_code == 202
    receiver.wait_for(1)
    wait_until(lambda: Attempt.objects.filter(endpoint_id=endpoint).exists())
    stack.worker.kill()  # the retry is due in the database, not held by this worker
    stack.start_worker("worker-2").wait_for_log("ready.")
    first, second = receiver.wait_for(2, timeout=60)
    for request in (first, second):
        assert signing.verify(request.body, request.headers[signing.HEADER], secret)
    assert json.loads(first.body)["event_id"] == json.loads(second.body)["event_id"]
    assert json.loads(first.body)["type"] == "notifications.test"
    assert second.at - first.at >= 1.0  # after its backoff

    def logged():
        return client.get(f"{ENDPOINTS}{endpoint}/deliveries/").json()["results"]

    wait_until(lambda: len(logged()) == 2)
    log = logged()
    assert [(a["number"], a["status_code"], a["ok"]) for a in log] == [
        (2, 200, True), (1, 500, False),
    ]  # fmt: skip
    assert log[0]["delivery_state"] == "delivered" and log[1]["error"] == "answered 500"
    assert log[1]["response_excerpt"] == "receiver is down" and log[0]["latency_ms"] >= 0


def test_delivery_never_holds_up_the_action_and_email_lands_in_the_mailbox(
    admin_api, receiver, tmp_path
):
    client = admin_api
    slow = add_endpoint(client, "slow", "slack", receiver.url, "budget.threshold")
    receiver.delay = 4.0
    started = time.monotonic()
    assert client.post(f"{ENDPOINTS}{slow['id']}/test/").status_code == 202
    assert time.monotonic() - started < 2.0  # the receiver takes 4 s to answer
    [request] = receiver.wait_for(1)
    assert json.loads(request.body)["text"].startswith("*A test notification* (Acme AI)")

    mail = add_endpoint(client, "mail", "email", "ops@acme.test", "invoice.issued")
    assert client.post(f"{ENDPOINTS}{mail['id']}/test/").status_code == 202
    folder = tmp_path / "mail"
    wait_until(lambda: folder.exists() and any(folder.iterdir()))
    [message] = [path.read_text() for path in folder.iterdir()]
    assert "To: ops@acme.test" in message
    assert "Subject: [gpucloud] Acme AI: A test notification" in message
    assert "this endpoint works" in message
