"""Invitations to a tenant by email address: an admin invites, the owner of the address accepts.

Inviting answers the same whether or not the address belongs to an account, so the form tells
nobody which addresses (or users) exist. The link's token is stored only as a hash. An
invitation holds only while its sender may still send it: accepting checks the sender's role,
and removing or demoting a member withdraws what they may no longer send
(accounts.services)."""

import secrets
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import BaseUserManager
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from accounts import locks, services
from accounts.models import Invitation, Membership, Tenant, hash_token
from accounts.roles import MANAGE, Role, may_invite

User = get_user_model()


def normalize_email(email: str) -> str:
    return BaseUserManager.normalize_email(email.strip())


def pending(tenant: Tenant) -> QuerySet[Invitation]:
    """The tenant's invitations that can still be accepted."""
    return Invitation.objects.filter(
        tenant=tenant,
        accepted_at__isnull=True,
        revoked_at__isnull=True,
        expires_at__gt=timezone.now(),
    ).select_related("invited_by")


def _open_for(tenant: Tenant, email: str) -> QuerySet[Invitation]:
    return Invitation.objects.filter(
        tenant=tenant, email__iexact=email, accepted_at__isnull=True, revoked_at__isnull=True
    )


@transaction.atomic
def invite(
    inviter: Membership, email: str, role: str, link_for: Callable[[str], str]
) -> Invitation:
    """Invite `email` into the inviter's tenant with `role` and email it a link (`link_for`
    turns the raw token into the link's URL) once committed. A new invitation to the same
    address replaces the one still open. Only admins and owners invite; only owners invite
    owners."""
    if not inviter.can(MANAGE):
        raise ValidationError(f"Your role ({inviter.role}) cannot invite; it needs {MANAGE}.")
    if role == Role.OWNER and not inviter.can(Role.OWNER):
        raise ValidationError({"role": "Only an owner can invite an owner."})
    tenant = inviter.tenant
    email = normalize_email(email)
    raw = secrets.token_urlsafe(32)
    now = timezone.now()
    invitation = Invitation(
        tenant=tenant,
        email=email,
        role=role,
        invited_by=inviter.user,
        token_hash=hash_token(raw),
        created_at=now,
        expires_at=now + timedelta(days=settings.INVITATION_VALID_DAYS),
    )
    invitation.full_clean()
    if Membership.objects.filter(tenant=tenant, user__email__iexact=email).exists():
        raise ValidationError({"email": f"{email} is already a member of {tenant}."})
    _open_for(tenant, email).update(revoked_at=now)
    invitation.save()
    link = link_for(raw)
    transaction.on_commit(lambda: _send(invitation, link))
    return invitation


def _send(invitation: Invitation, link: str) -> None:
    inviter = invitation.invited_by.username if invitation.invited_by else "An administrator"
    tenant = invitation.tenant.name
    next_step = (
        "Open this link, sign in with your account and accept:"
        if has_account(invitation)
        else "Open this link to create your gpucloud account and join:"
    )
    body = "\n".join(
        [
            f"{inviter} invited you to join {tenant} on gpucloud as {invitation.role}.",
            "",
            next_step,
            link,
            "",
            f"The link works once, until {invitation.expires_at:%Y-%m-%d %H:%M} UTC.",
            "If you did not expect this invitation, ignore this email.",
            "",
            "-- gpucloud",
        ]
    )
    send_mail(
        f"You are invited to {tenant} on gpucloud",
        body,
        settings.DEFAULT_FROM_EMAIL,
        [invitation.email],
    )


def find(raw: str) -> Invitation | None:
    return (
        Invitation.objects.select_related("tenant", "invited_by")
        .filter(token_hash=hash_token(raw))
        .first()
    )


def is_for(invitation: Invitation, user) -> bool:
    return bool(user.email) and user.email.strip().lower() == invitation.email.lower()


def has_account(invitation: Invitation) -> bool:
    return User.objects.filter(email__iexact=invitation.email, is_active=True).exists()


def withdrawn_because(invitation: Invitation) -> str | None:
    """Why the invitation no longer holds because of its sender (gone from the tenant, or
    in a role that may not send it); None while it holds."""
    sender = invitation.invited_by
    tenant = invitation.tenant
    membership = (
        Membership.objects.filter(tenant=tenant, user=sender, user__is_active=True).first()
        if sender is not None
        else None
    )
    if membership is not None and may_invite(membership.role, invitation.role):
        return None
    who = f"{sender.username}, who sent it," if sender is not None else "The member who sent it"
    if membership is None:
        lapse = f"{who} is no longer a member of {tenant.name}"
    else:
        lapse = (
            f"{who} is now {membership.role} of {tenant.name} "
            f"and may not invite as {invitation.role}"
        )
    return f"This invitation was withdrawn: {lapse}."


def refusal(invitation: Invitation) -> str | None:
    """Why the invitation's link can no longer be used, in words for the invited person, or
    None while it can."""
    state = invitation.state
    reason = withdrawn_because(invitation) if state in ("pending", "revoked") else None
    if reason is None and state != "pending":
        reason = {
            "accepted": "This invitation was accepted: it has already been used.",
            "revoked": "This invitation has been revoked.",
            "expired": "This invitation has expired.",
        }[state]
    return f"{reason} Ask an admin of the tenant for a new one." if reason else None


def _lock_usable(invitation: Invitation) -> Invitation:
    locked = locks.invitation(invitation.pk)
    reason = refusal(locked)
    if reason:
        raise ValidationError(reason)
    return locked


@transaction.atomic
def accept(invitation: Invitation, user) -> Membership:
    """Make `user` a member with the invitation's role. The user's email must be the one
    invited; an invitation is used once."""
    locked = _lock_usable(invitation)
    if not user.is_active or not is_for(locked, user):
        raise ValidationError("This invitation was sent to another email address.")
    membership = services.add_member(locked.tenant, user, locked.role)
    locked.accepted_at = timezone.now()
    locked.accepted_by = user
    locked.save(update_fields=["accepted_at", "accepted_by"])
    return membership


@transaction.atomic
def sign_up(invitation: Invitation, username: str, password: str) -> Membership:
    """Create an account for the invited address (the username and password pass the same
    validators as everywhere) and accept the invitation with it."""
    locked = _lock_usable(invitation)
    if has_account(locked):
        raise ValidationError("An account with this email address exists: sign in to accept.")
    user = User(username=username.strip(), email=locked.email)
    try:
        validate_password(password, user)
    except ValidationError as error:
        raise ValidationError({"password": error.messages}) from None
    user.set_password(password)
    user.full_clean()
    user.save()
    return accept(locked, user)


@transaction.atomic
def revoke(invitation: Invitation) -> Invitation:
    if invitation.state == "pending":
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at"])
    return invitation
