"""An invitation holds only while its sender may still send it (issue 33, item 4)."""

import re

import pytest
from django.test import Client

from accounts.models import Membership
from accounts.roles import Role
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def signed_in(membership) -> Client:
    client = Client()
    client.force_login(membership.user)
    client.post("/tenant/switch/", {"tenant": membership.tenant_id})
    return client


def invite(client, email, role, django_capture_on_commit_callbacks, mailoutbox) -> str:
    with django_capture_on_commit_callbacks(execute=True):
        client.post("/members/", {"email": email, "role": role})
    return re.search(r"http://testserver(/invitations/[\w-]+/)", mailoutbox[-1].body).group(1)


def test_a_removed_admins_invitation_is_refused_with_the_reason(
    tenant, make_member, django_capture_on_commit_callbacks, mailoutbox
):
    owner = make_member(tenant, Role.OWNER, username="olivia")
    admin = make_member(tenant, Role.ADMIN, username="ada")
    link = invite(
        signed_in(admin), "ada.again@example.com", Role.ADMIN,
        django_capture_on_commit_callbacks, mailoutbox,
    )  # fmt: skip
    signed_in(owner).post(f"/members/{admin.pk}/remove/")
    assert not Membership.objects.filter(pk=admin.pk).exists()

    visitor = Client()
    page = visitor.get(link)
    assert page.status_code == 410
    assert b"withdrawn: ada, who sent it, is no longer a member of Acme AI" in page.content
    sign_up = {"username": "ada2", "password": "a-long-unusual-passphrase"}
    refused = visitor.post(link, {**sign_up, "password_again": sign_up["password"]})
    assert refused.status_code == 410
    assert not Membership.objects.filter(tenant=tenant, role=Role.ADMIN).exists()
    assert not signed_in(owner).get("/members/").content.count(b"ada.again@example.com")


def test_a_demoted_admins_invitation_is_refused_to_a_signed_in_account(
    tenant, make_member, django_capture_on_commit_callbacks, mailoutbox
):
    owner = make_member(tenant, Role.OWNER, username="olivia")
    admin = make_member(tenant, Role.ADMIN, username="ada")
    link = invite(
        signed_in(admin), "erin@example.com", Role.MEMBER,
        django_capture_on_commit_callbacks, mailoutbox,
    )  # fmt: skip
    signed_in(owner).post(f"/members/{admin.pk}/role/", {"role": Role.VIEWER})
    assert Membership.objects.get(pk=admin.pk).role == Role.VIEWER

    erin = Client()
    erin.force_login(UserFactory(username="erin", email="erin@example.com"))
    page = erin.get(link)
    assert page.status_code == 410
    assert b"ada, who sent it, is now viewer of Acme AI and may not invite as member" in (
        page.content
    )
    assert erin.post(link).status_code == 410
    assert not Membership.objects.filter(user__username="erin").exists()
