"""accept() checks the sender's authority; removing or demoting a member withdraws what they
may no longer send, and keeps what they still may."""

import pytest
from django.core.exceptions import ValidationError

from accounts import invitations, services
from accounts.models import Membership
from accounts.roles import Role
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def send(inviter, email, role):
    return invitations.invite(inviter, email, role, lambda raw: f"/invitations/{raw}/")


def test_acceptance_checks_the_sender_even_when_nothing_withdrew_the_invitation(
    tenant, make_member
):
    admin = make_member(tenant, Role.ADMIN, username="ada")
    invitation = send(admin, "erin@example.com", Role.ADMIN)
    Membership.objects.filter(pk=admin.pk).delete()  # e.g. deleted in the admin site
    assert invitation.state == "pending"
    with pytest.raises(ValidationError, match="ada, who sent it, is no longer a member"):
        invitations.accept(invitation, UserFactory(email="erin@example.com"))
    assert not Membership.objects.filter(user__email="erin@example.com").exists()


def test_a_deactivated_sender_no_longer_vouches(tenant, make_member):
    admin = make_member(tenant, Role.ADMIN, username="ada")
    invitation = send(admin, "erin@example.com", Role.MEMBER)
    admin.user.is_active = False
    admin.user.save()
    with pytest.raises(ValidationError, match="withdrawn"):
        invitations.accept(invitation, UserFactory(email="erin@example.com"))


def test_demotion_withdraws_only_what_the_new_role_may_not_send(tenant, make_member):
    make_member(tenant, Role.OWNER)
    boss = make_member(tenant, Role.OWNER, username="bo")
    as_owner = send(boss, "o@example.com", Role.OWNER)
    as_admin = send(boss, "a@example.com", Role.ADMIN)
    services.change_role(boss, Role.ADMIN)
    as_owner.refresh_from_db()
    as_admin.refresh_from_db()
    assert (as_owner.state, as_admin.state) == ("revoked", "pending")
    assert "bo, who sent it, is now admin of Acme AI and may not invite as owner" in (
        invitations.refusal(as_owner)
    )
    assert invitations.refusal(as_admin) is None
    membership = invitations.accept(as_admin, UserFactory(email="a@example.com"))
    assert membership.role == Role.ADMIN


def test_removing_a_member_withdraws_their_open_invitations_only(tenant, make_member):
    owner = make_member(tenant, Role.OWNER)
    admin = make_member(tenant, Role.ADMIN)
    theirs = send(admin, "x@example.com", Role.VIEWER)
    owners = send(owner, "y@example.com", Role.VIEWER)
    services.remove_member(admin)
    theirs.refresh_from_db()
    owners.refresh_from_db()
    assert (theirs.state, owners.state) == ("revoked", "pending")
    assert list(invitations.pending(tenant)) == [owners]
