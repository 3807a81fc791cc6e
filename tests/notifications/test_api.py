"""/api/v1/notifications/endpoints/: admins manage the tenant's endpoints; field-level 400s,
viewers and members refused, another tenant's endpoint not found."""

import pytest
from django.utils import timezone

from accounts.roles import Role
from console.notifications import services
from console.notifications.models import Attempt, Delivery, Endpoint

pytestmark = pytest.mark.django_db

URL = "/api/v1/notifications/endpoints/"


@pytest.fixture
def admin(tenant, make_member, token_client):
    return token_client(make_member(tenant, Role.ADMIN))


def test_an_admin_adds_a_webhook_and_sees_its_secret_once(admin, private_allowed, receiver):
    body = {"name": "ours", "channel": "webhook", "target": receiver.url,
            "kinds": ["invoice.issued", "instance.failed"]}  # fmt: skip
    created = admin.post(URL, body, format="json")
    assert created.status_code == 201, created.json()
    data = created.json()
    assert data["secret"].startswith("whsec_")
    assert data["kinds"] == ["instance.failed", "invoice.issued"]  # in the kinds' order
    shown = admin.get(f"{URL}{data['id']}/").json()
    assert "secret" not in shown and shown["target"] == receiver.url
    assert [e["name"] for e in admin.get(URL).json()["results"]] == ["ours"]


def test_email_and_slack_endpoints_have_no_secret(admin, private_allowed, receiver):
    email = admin.post(URL, {"name": "mail", "channel": "email", "target": "ops@acme.test",
                             "kinds": ["budget.threshold"]}, format="json")  # fmt: skip
    assert email.status_code == 201 and email.json()["secret"] is None
    slack = admin.post(URL, {"name": "slack", "channel": "slack", "target": receiver.url,
                             "kinds": ["budget.threshold"]}, format="json")  # fmt: skip
    assert slack.status_code == 201 and slack.json()["secret"] is None
    rotate = admin.post(f"{URL}{slack.json()['id']}/rotate-secret/")
    assert rotate.status_code == 409 and rotate.json()["code"] == "not_a_webhook"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"channel": "webhook", "target": "https://hooks.example.com/x", "kinds": ["nope"]},
         "kinds"),
        ({"channel": "webhook", "target": "https://hooks.example.com/x", "kinds": []}, "kinds"),
        ({"channel": "webhook", "target": "http://hooks.example.com/x",
          "kinds": ["instance.failed"]}, "target"),
        ({"channel": "webhook", "target": "not a url", "kinds": ["instance.failed"]}, "target"),
        ({"channel": "email", "target": "not-an-address", "kinds": ["instance.failed"]}, "target"),
        ({"channel": "pager", "target": "x", "kinds": ["instance.failed"]}, "channel"),
    ],
)  # fmt: skip
def test_bad_input_is_a_field_error(admin, body, field):
    answer = admin.post(URL, {"name": "x", **body}, format="json")
    assert answer.status_code == 400, answer.json()
    assert field in answer.json()["errors"]


def test_names_are_unique_per_tenant(admin, tenant):
    services.create_endpoint(
        tenant, name="ops", channel="email", target="a@acme.test", kinds=["instance.failed"]
    )
    answer = admin.post(URL, {"name": "ops", "channel": "email", "target": "b@acme.test",
                              "kinds": ["instance.failed"]}, format="json")  # fmt: skip
    assert answer.status_code == 400 and "name" in answer.json()["errors"]


def test_edit_kinds_test_rotate_and_the_delivery_log(admin, tenant, private_allowed, receiver):
    endpoint, first = services.create_endpoint(
        tenant, name="ours", channel="webhook", target=receiver.url, kinds=["instance.failed"]
    )
    edited = admin.patch(f"{URL}{endpoint.pk}/", {"kinds": ["snapshot.done"]}, format="json")
    assert edited.status_code == 200 and edited.json()["kinds"] == ["snapshot.done"]
    bad = admin.patch(f"{URL}{endpoint.pk}/", {"target": "ftp://x"}, format="json")
    assert bad.status_code == 400 and "target" in bad.json()["errors"]
    tested = admin.post(f"{URL}{endpoint.pk}/test/")
    assert tested.status_code == 202
    delivery = Delivery.objects.get(pk=tested.json()["delivery"])
    assert delivery.notice.kind == "notifications.test" and delivery.endpoint_id == endpoint.pk
    services.attempt_delivery(delivery.pk)
    log = admin.get(f"{URL}{endpoint.pk}/deliveries/").json()["results"]
    assert [(a["kind"], a["status_code"], a["ok"], a["number"]) for a in log] == [
        ("notifications.test", 200, True, 1)
    ]
    assert log[0]["event_id"] == str(delivery.notice.event_id)
    rotated = admin.post(f"{URL}{endpoint.pk}/rotate-secret/")
    assert rotated.status_code == 200
    assert rotated.json()["secret"] not in (first, None)
    assert rotated.json()["previous_valid_until"] > timezone.now().isoformat()
    assert admin.delete(f"{URL}{endpoint.pk}/").status_code == 204
    assert not Endpoint.objects.exists() and not Attempt.objects.exists()


@pytest.mark.parametrize("role", [Role.VIEWER, Role.MEMBER])
def test_viewers_and_members_cannot_manage(tenant, make_member, token_client, role):
    endpoint, _ = services.create_endpoint(
        tenant, name="ops", channel="email", target="a@acme.test", kinds=["instance.failed"]
    )
    client = token_client(make_member(tenant, role))
    assert client.get(URL).status_code == 403
    assert client.post(URL, {}, format="json").status_code == 403
    assert client.post(f"{URL}{endpoint.pk}/test/").status_code == 403
    assert client.post(f"{URL}{endpoint.pk}/rotate-secret/").status_code == 403
    assert client.delete(f"{URL}{endpoint.pk}/").status_code == 403


def test_another_tenants_endpoint_is_not_found(admin, other_tenant):
    theirs, _ = services.create_endpoint(
        other_tenant, name="x", channel="email", target="a@globex.test", kinds=["instance.failed"]
    )
    for answer in (
        admin.get(f"{URL}{theirs.pk}/"),
        admin.patch(f"{URL}{theirs.pk}/", {"enabled": False}, format="json"),
        admin.post(f"{URL}{theirs.pk}/test/"),
        admin.post(f"{URL}{theirs.pk}/rotate-secret/"),
        admin.get(f"{URL}{theirs.pk}/deliveries/"),
        admin.delete(f"{URL}{theirs.pk}/"),
    ):
        assert answer.status_code == 404
    assert admin.get(URL).json()["results"] == []
    assert Endpoint.objects.get(pk=theirs.pk).enabled and not Delivery.objects.exists()
