import re
from datetime import timedelta

import pytest
import time_machine
from django.contrib.messages import get_messages
from django.test import Client
from django.utils import timezone

from accounts import invitations
from accounts.models import Invitation, Membership
from accounts.roles import Role
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

# What differs between two renderings of one page: the CSRF token, an invitation's id.
VARYING = re.compile(rb'name="csrfmiddlewaretoken" value="[^"]+"|/members/invitations/\d+/')


def login(client, membership):
    client.force_login(membership.user)
    client.post("/tenant/switch/", {"tenant": membership.tenant_id})
    return client


def flash(response) -> str:
    return " ".join(str(m) for m in get_messages(response.wsgi_request))


@pytest.fixture
def invite_from_page(client, django_capture_on_commit_callbacks, mailoutbox):
    """POST the members page's invitation form; answer the response and the emailed link."""

    def invite(email, role=Role.MEMBER):
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post("/members/", {"email": email, "role": role})
        sent = [m for m in mailoutbox if m.to == [email]]
        link = re.search(r"http://testserver(/invitations/[\w-]+/)", sent[-1].body).group(1)
        return response, link

    return invite


@pytest.fixture
def invited(tenant, make_member, django_capture_on_commit_callbacks, mailoutbox):
    """An open invitation of erin@example.com as admin, and the path of its link."""
    owner = make_member(tenant, Role.OWNER, username="olivia")
    with django_capture_on_commit_callbacks(execute=True):
        invitation = invitations.invite(
            owner, "erin@example.com", Role.ADMIN, lambda raw: f"/invitations/{raw}/"
        )
    return invitation, re.search(r"/invitations/[\w-]+/", mailoutbox[-1].body).group(0)


def test_admin_invites_by_email_and_sees_the_open_invitation(
    client, tenant, make_member, invite_from_page, mailoutbox
):
    login(client, make_member(tenant, Role.ADMIN, username="ada"))
    response, link = invite_from_page("new@example.com", Role.VIEWER)
    assert response.status_code == 302
    assert "sent to new@example.com" in flash(response)
    assert "ada invited you to join Acme AI on gpucloud as viewer" in mailoutbox[-1].body
    page = client.get("/members/")
    assert b'data-invitation="new@example.com"' in page.content
    assert b"/members/invitations/" in page.content  # its revoke button
    assert link.encode() not in page.content


def test_inviting_answers_the_same_for_known_and_unknown_addresses(
    client, tenant, make_member, invite_from_page
):
    login(client, make_member(tenant, Role.ADMIN)).get("/members/")  # shows the sign-in message
    answers = []
    with time_machine.travel(timezone.now(), tick=False):
        for _ in ("no account", "an account"):
            response, _ = invite_from_page("someone@example.com")
            page = client.get("/members/")
            answers.append(
                (
                    response.status_code,
                    response["Location"],
                    flash(response),
                    VARYING.sub(b"", page.content),
                )
            )
            UserFactory(username="someone", email="someone@example.com")
    assert answers[0] == answers[1]


def test_the_old_add_by_username_is_gone(client, tenant, make_member):
    login(client, make_member(tenant, Role.OWNER))
    UserFactory(username="erin")
    response = client.post("/members/", {"username": "erin", "role": Role.MEMBER})
    assert response.status_code == 200
    assert b"This field is required" in response.content
    assert not Membership.objects.filter(user__username="erin").exists()
    assert not Invitation.objects.exists()
    assert b'name="username"' not in client.get("/members/").content


def test_a_bad_address_is_a_field_error(client, tenant, make_member):
    login(client, make_member(tenant, Role.ADMIN))
    response = client.post("/members/", {"email": "not an address", "role": Role.MEMBER})
    assert b"Enter a valid email address" in response.content
    assert not Invitation.objects.exists()


def test_only_an_owner_invites_an_owner_from_the_page(
    client, tenant, make_member, invite_from_page
):
    admin = make_member(tenant, Role.ADMIN)
    login(client, admin)
    refused = client.post("/members/", {"email": "boss@example.com", "role": Role.OWNER})
    assert b"Only an owner can invite an owner." in refused.content
    assert not Invitation.objects.exists()
    login(client, make_member(tenant, Role.OWNER))
    invite_from_page("boss@example.com", Role.OWNER)
    assert Invitation.objects.get().role == Role.OWNER


def test_signed_in_user_with_the_address_accepts_with_one_post(tenant, invited):
    invitation, link = invited
    erin = UserFactory(username="erin", email="erin@example.com")
    client = Client(enforce_csrf_checks=True)
    client.force_login(erin)
    page = client.get(link)
    assert b"Join Acme AI" in page.content
    assert client.post(link).status_code == 403  # no CSRF token
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.content).group(1)
    accepted = client.post(link, {"csrfmiddlewaretoken": token.decode()})
    assert accepted["Location"] == "/"
    assert Membership.objects.get(user=erin, tenant=tenant).role == Role.ADMIN
    assert b"Acme AI" in client.get("/").content
    again = client.get(link)
    assert again.status_code == 410
    assert b"already been used" in again.content


def test_another_users_account_cannot_accept(client, tenant, invited):
    _, link = invited
    client.force_login(UserFactory(username="mallory", email="mallory@example.com"))
    page = client.get(link)
    assert page.status_code == 403
    assert b"not the invited one" in page.content
    assert client.post(link).status_code == 403
    assert not Membership.objects.filter(user__username="mallory").exists()


def test_signed_out_visitor_with_an_account_is_asked_to_sign_in(client, tenant, invited):
    _, link = invited
    UserFactory(username="erin", email="erin@example.com")
    page = client.get(link)
    assert b"Sign in to accept" in page.content
    signed_in = client.post(
        "/login/", {"username": "erin", "password": "correct-horse-battery", "next": link}
    )
    assert signed_in["Location"] == link
    assert client.post(link)["Location"] == "/"
    assert Membership.objects.filter(user__username="erin", tenant=tenant).exists()


def test_signed_out_visitor_without_an_account_signs_up_and_joins(client, tenant, invited):
    invitation, link = invited
    assert b"Create account and join" in client.get(link).content
    mismatch = {"username": "erin", "password": "a-long-unusual-passphrase"}
    assert b"The two passwords differ" in client.post(link, mismatch).content
    weak = {"username": "erin", "password": "password", "password_again": "password"}
    assert b"too common" in client.post(link, weak).content
    assert not Membership.objects.filter(tenant=tenant, user__username="erin").exists()
    good = {**mismatch, "password_again": mismatch["password"]}
    joined = client.post(link, good)
    assert joined["Location"] == "/"
    assert "You joined Acme AI as admin" in flash(joined)
    erin = Membership.objects.get(tenant=tenant, role=Role.ADMIN).user
    assert (erin.username, erin.email) == ("erin", "erin@example.com")
    assert b"Acme AI" in client.get("/").content


def test_used_revoked_expired_and_unknown_links_say_so(client, tenant, invited):
    invitation, link = invited
    assert client.get("/invitations/not-a-token/").status_code == 404
    with time_machine.travel(invitation.expires_at + timedelta(seconds=1)):
        expired = client.get(link)
    assert (expired.status_code, b"has expired" in expired.content) == (410, True)
    invitations.revoke(invitation)
    revoked = client.post(link, {"username": "erin", "password": "x", "password_again": "x"})
    assert (revoked.status_code, b"has been revoked" in revoked.content) == (410, True)
    assert not Membership.objects.filter(user__username="erin").exists()


def test_revoking_from_the_members_page(client, tenant, make_member, invited, other_tenant):
    invitation, link = invited
    login(client, make_member(tenant, Role.ADMIN))
    client.post(f"/members/invitations/{invitation.pk}/revoke/")
    assert b'data-invitation="erin@example.com"' not in client.get("/members/").content
    assert client.get(link).status_code == 410
    foreign = invitations.invite(
        make_member(other_tenant, Role.OWNER), "x@example.com", Role.MEMBER, str
    )
    assert client.post(f"/members/invitations/{foreign.pk}/revoke/").status_code == 404
    foreign.refresh_from_db()
    assert foreign.state == "pending"


def test_viewers_do_not_see_open_invitations(client, tenant, make_member, invited):
    page = login(client, make_member(tenant, Role.VIEWER)).get("/members/")
    assert b"erin@example.com" not in page.content
    assert b"Invite a member" not in page.content


def test_operators_list_and_revoke_invitations_in_the_admin(admin_client, invited):
    invitation, link = invited
    listed = admin_client.get("/admin/accounts/invitation/")
    assert b"erin@example.com" in listed.content
    assert b"pending" in listed.content
    admin_client.post(
        "/admin/accounts/invitation/",
        {"action": "revoke", "_selected_action": [invitation.pk]},
    )
    invitation.refresh_from_db()
    assert invitation.state == "revoked"
    assert admin_client.get("/admin/accounts/invitation/add/").status_code == 403
