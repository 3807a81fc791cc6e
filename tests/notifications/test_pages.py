"""The console's Notifications pages."""

import pytest
from django.test import Client

from accounts.roles import Role
from console.notifications import services
from console.notifications.models import Delivery, Endpoint

pytestmark = pytest.mark.django_db


def signed_in(membership) -> Client:
    client = Client()
    client.force_login(membership.user)
    return client


def test_an_admin_adds_a_webhook_sees_the_secret_once_and_sends_a_test(
    tenant, make_member, private_allowed, receiver
):
    client = signed_in(make_member(tenant, Role.ADMIN))
    assert b"Add an endpoint" in client.get("/notifications/").content
    added = client.post(
        "/notifications/",
        {"name": "ours", "channel": "webhook", "target": receiver.url,
         "kinds": ["instance.failed", "host.maintenance"], "enabled": "on"},
    )  # fmt: skip
    endpoint = Endpoint.objects.get()
    assert added.status_code == 302 and added.url == f"/notifications/{endpoint.pk}/"
    page = client.get(added.url).content.decode()
    assert 'data-testid="new-secret"' in page and "whsec_" in page
    assert "whsec_" not in client.get(added.url).content.decode()  # shown once
    client.post(f"/notifications/{endpoint.pk}/test/")
    services.attempt_delivery(Delivery.objects.get().pk)
    log = client.get(added.url).content.decode()
    assert "notifications.test" in log and "(200)" in log
    rotated = client.post(f"/notifications/{endpoint.pk}/rotate-secret/", follow=True)
    assert "whsec_" in rotated.content.decode()


def test_bad_input_shows_on_the_form(tenant, make_member):
    client = signed_in(make_member(tenant, Role.ADMIN))
    page = client.post(
        "/notifications/",
        {"name": "x", "channel": "webhook", "target": "http://10.0.0.5/hook",
         "kinds": ["instance.failed"]},
    )  # fmt: skip
    assert page.status_code == 200 and b"This URL cannot be used" in page.content
    assert not Endpoint.objects.exists()


def test_members_are_sent_back_and_other_tenants_endpoints_are_not_found(
    tenant, other_tenant, make_member
):
    theirs, _ = services.create_endpoint(
        other_tenant, name="x", channel="email", target="a@globex.test", kinds=["instance.failed"]
    )
    member = signed_in(make_member(tenant, Role.MEMBER))
    assert member.get("/notifications/").status_code == 302
    admin = signed_in(make_member(tenant, Role.ADMIN))
    assert admin.get(f"/notifications/{theirs.pk}/").status_code == 404
    assert admin.post(f"/notifications/{theirs.pk}/delete/").status_code == 404
    assert Endpoint.objects.filter(pk=theirs.pk).exists()
