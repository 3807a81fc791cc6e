import re
from datetime import timedelta

import pytest
import time_machine
from django.core.exceptions import ValidationError
from django.utils import timezone

from accounts import invitations, services
from accounts.models import Invitation, Membership, hash_token
from accounts.roles import Role
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def link_for(raw: str) -> str:
    return f"https://console.example/invitations/{raw}/"


@pytest.fixture
def send(django_capture_on_commit_callbacks, mailoutbox):
    """Invite as `inviter` and answer (invitation, raw token read from the email sent)."""

    def invite(inviter, email, role=Role.MEMBER):
        with django_capture_on_commit_callbacks(execute=True):
            invitation = invitations.invite(inviter, email, role, link_for)
        raw = re.search(r"/invitations/([\w-]+)/", mailoutbox[-1].body).group(1)
        return invitation, raw

    return invite


def test_invite_emails_a_link_and_stores_only_its_hash(tenant, make_member, send, mailoutbox):
    admin = make_member(tenant, Role.ADMIN)
    invitation, raw = send(admin, " New.Hire@Example.COM ", Role.VIEWER)
    assert invitation.email == "New.Hire@example.com"
    assert invitation.invited_by == admin.user
    assert invitation.state == "pending"
    assert mailoutbox[-1].to == ["New.Hire@example.com"]
    assert "Acme AI" in mailoutbox[-1].subject
    assert invitation.token_hash == hash_token(raw)
    assert raw not in str(Invitation.objects.values().get(pk=invitation.pk))
    assert invitations.find(raw) == invitation
    assert invitations.find(raw + "x") is None


def test_the_email_offers_sign_up_to_an_unknown_address_and_sign_in_to_a_known_one(
    tenant, make_member, send, mailoutbox
):
    admin = make_member(tenant, Role.ADMIN)
    send(admin, "nobody@example.com")
    assert "create your gpucloud account" in mailoutbox[-1].body
    UserFactory(username="known", email="known@example.com")
    send(admin, "known@example.com")
    assert "sign in with your account" in mailoutbox[-1].body


def test_accept_makes_a_member_with_the_invited_role(tenant, make_member, send):
    invitation, raw = send(make_member(tenant, Role.ADMIN), "erin@example.com", Role.ADMIN)
    erin = UserFactory(username="erin", email="Erin@Example.com")
    membership = invitations.accept(invitations.find(raw), erin)
    assert (membership.tenant, membership.role) == (tenant, Role.ADMIN)
    invitation.refresh_from_db()
    assert invitation.state == "accepted"
    assert invitation.accepted_by == erin


def test_a_user_with_another_email_cannot_accept(tenant, make_member, send):
    invitation, _ = send(make_member(tenant, Role.ADMIN), "erin@example.com")
    for mallory in (
        UserFactory(username="mallory", email="mallory@example.com"),
        UserFactory(username="blank", email=""),
    ):
        with pytest.raises(ValidationError, match="another email address"):
            invitations.accept(invitation, mallory)
    assert not Membership.objects.filter(user__username__in=["mallory", "blank"]).exists()
    invitation.refresh_from_db()
    assert invitation.state == "pending"


def test_an_invitation_is_used_once(tenant, make_member, send):
    invitation, _ = send(make_member(tenant, Role.ADMIN), "erin@example.com")
    erin = UserFactory(username="erin", email="erin@example.com")
    invitations.accept(invitation, erin)
    services.remove_member(Membership.objects.get(user=erin))
    with pytest.raises(ValidationError, match="accepted"):
        invitations.accept(invitation, erin)
    assert not Membership.objects.filter(user=erin).exists()


def test_an_expired_invitation_cannot_be_accepted(tenant, make_member, send, settings):
    settings.INVITATION_VALID_DAYS = 3
    invitation, _ = send(make_member(tenant, Role.ADMIN), "erin@example.com")
    assert invitation.expires_at == invitation.created_at + timedelta(days=3)
    erin = UserFactory(username="erin", email="erin@example.com")
    with time_machine.travel(timezone.now() + timedelta(days=3, seconds=1)):
        assert invitation.state == "expired"
        assert list(invitations.pending(tenant)) == []
        with pytest.raises(ValidationError, match="expired"):
            invitations.accept(invitation, erin)
    assert not Membership.objects.filter(user=erin).exists()


def test_a_revoked_invitation_cannot_be_accepted(tenant, make_member, send):
    invitation, _ = send(make_member(tenant, Role.ADMIN), "erin@example.com")
    invitations.revoke(invitation)
    assert list(invitations.pending(tenant)) == []
    with pytest.raises(ValidationError, match="revoked"):
        invitations.accept(invitation, UserFactory(username="erin", email="erin@example.com"))


def test_inviting_the_same_address_again_replaces_the_open_invitation(tenant, make_member, send):
    admin = make_member(tenant, Role.ADMIN)
    first, _ = send(admin, "erin@example.com")
    second, _ = send(admin, "ERIN@example.com", Role.ADMIN)
    first.refresh_from_db()
    assert first.state == "revoked"
    assert list(invitations.pending(tenant)) == [second]


@pytest.mark.parametrize("role", [Role.VIEWER, Role.MEMBER])
def test_viewers_and_members_cannot_invite(tenant, make_member, role):
    with pytest.raises(ValidationError, match="cannot invite"):
        invitations.invite(make_member(tenant, role), "erin@example.com", Role.VIEWER, link_for)
    assert not Invitation.objects.exists()


def test_only_owners_invite_owners(tenant, make_member, send):
    with pytest.raises(ValidationError) as error:
        invitations.invite(make_member(tenant, Role.ADMIN), "erin@example.com", "owner", link_for)
    assert "role" in error.value.message_dict
    assert not Invitation.objects.exists()
    invitation, _ = send(make_member(tenant, Role.OWNER), "erin@example.com", Role.OWNER)
    assert invitation.role == Role.OWNER


@pytest.mark.parametrize(
    ("email", "role", "field"),
    [("not-an-address", Role.MEMBER, "email"), ("erin@example.com", "superuser", "role")],
)
def test_bad_address_or_role_is_a_field_error(tenant, make_member, email, role, field):
    with pytest.raises(ValidationError) as error:
        invitations.invite(make_member(tenant, Role.OWNER), email, role, link_for)
    assert field in error.value.message_dict
    assert not Invitation.objects.exists()


def test_a_member_is_not_invited_again(tenant, make_member):
    make_member(tenant, Role.VIEWER, username="erin")
    with pytest.raises(ValidationError) as error:
        invitations.invite(make_member(tenant, Role.ADMIN), "erin@example.com", "admin", link_for)
    assert "already a member" in error.value.message_dict["email"][0]


def test_sign_up_creates_the_account_with_the_invited_address(tenant, make_member, send):
    invitation, _ = send(make_member(tenant, Role.ADMIN), "new@example.com", Role.VIEWER)
    membership = invitations.sign_up(invitation, "newbie", "a-long-unusual-passphrase")
    user = membership.user
    assert (user.username, user.email) == ("newbie", "new@example.com")
    assert user.check_password("a-long-unusual-passphrase")
    assert membership.role == Role.VIEWER
    invitation.refresh_from_db()
    assert invitation.accepted_by == user


@pytest.mark.parametrize(
    ("username", "password", "field"),
    [
        ("newbie", "short", "password"),
        ("newbie", "password123", "password"),
        ("newbie", "thenewbie1", "password"),  # too like the username
        ("taken", "a-long-unusual-passphrase", "username"),
        ("bad name!", "a-long-unusual-passphrase", "username"),
    ],
)
def test_sign_up_refuses_weak_passwords_and_bad_usernames(
    tenant, make_member, send, username, password, field
):
    UserFactory(username="taken", email="taken@example.com")
    invitation, _ = send(make_member(tenant, Role.ADMIN), "new@example.com")
    with pytest.raises(ValidationError) as error:
        invitations.sign_up(invitation, username, password)
    assert field in error.value.message_dict
    assert not Membership.objects.filter(user__email="new@example.com").exists()
    invitation.refresh_from_db()
    assert invitation.state == "pending"


def test_sign_up_is_refused_when_the_address_has_an_account(tenant, make_member, send):
    invitation, _ = send(make_member(tenant, Role.ADMIN), "erin@example.com")
    UserFactory(username="erin", email="erin@example.com")
    with pytest.raises(ValidationError, match="sign in"):
        invitations.sign_up(invitation, "erin2", "a-long-unusual-passphrase")
    assert not Membership.objects.filter(tenant=tenant, user__username__startswith="erin").exists()
