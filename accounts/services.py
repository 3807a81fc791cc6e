"""Every change to tenants, memberships and tokens goes through one of these functions."""

import secrets
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, FilteredRelation, Q
from django.utils import timezone

from accounts import locks
from accounts import scopes as scope_rules
from accounts.models import ApiToken, Invitation, Membership, Quota, Tenant, hash_token
from accounts.roles import OPERATE, Role, may_invite
from accounts.signals import tenant_suspended
from console.audit import recorder as audit
from console.errors import DomainError, ErrorCode
from console.speedups.prepared import Prepared, columns, instances

User = get_user_model()


@transaction.atomic
def create_tenant(
    slug: str,
    name: str = "",
    gpu_quota: Decimal | str = Decimal("1"),
    max_instances: int = 4,
    monthly_budget: Decimal | str | None = None,
) -> Tenant:
    tenant = Tenant(slug=slug, name=name or slug.replace("-", " ").title())
    tenant.full_clean()
    tenant.save()
    quota = Quota(
        tenant=tenant,
        gpu_quota=gpu_quota,
        max_instances=max_instances,
        monthly_budget=monthly_budget,
    )
    quota.full_clean()
    quota.save()
    return tenant


@transaction.atomic
def update_quota(quota: Quota, **fields) -> Quota:
    for name, value in fields.items():
        setattr(quota, name, value)
    quota.full_clean()
    quota.save()
    return quota


@transaction.atomic
def set_tenant_status(tenant: Tenant, status: str) -> Tenant:
    """Suspending refuses the tenant's sign-ins to the console and API and, once committed,
    stops its running instances (their disks stay); reactivating lets it start them again."""
    suspending = status == Tenant.Status.SUSPENDED and tenant.status != status
    tenant.status = status
    tenant.suspended_at = timezone.now() if status == Tenant.Status.SUSPENDED else None
    tenant.save(update_fields=["status", "suspended_at"])
    if suspending:
        transaction.on_commit(lambda: tenant_suspended.send(sender=Tenant, tenant=tenant))
    return tenant


def _check_role(role: str) -> None:
    if role not in Role.values:
        raise ValidationError(
            {"role": f"Unknown role {role!r}; use one of {', '.join(Role.values)}."}
        )


@transaction.atomic
def add_member(tenant: Tenant, user, role: str) -> Membership:
    _check_role(role)
    if Membership.objects.filter(tenant=tenant, user=user).exists():
        raise ValidationError({"username": f"{user.username} is already a member of {tenant}."})
    return Membership.objects.create(tenant=tenant, user=user, role=role)


@transaction.atomic
def change_role(membership: Membership, role: str) -> Membership:
    _check_role(role)
    owners = locks.owners(membership.tenant)
    membership.refresh_from_db()
    if membership.role == Role.OWNER and role != Role.OWNER and len(owners) <= 1:
        raise ValidationError({"role": "A tenant needs at least one owner."})
    membership.role = role
    membership.save(update_fields=["role"])
    _withdraw_invitations(membership.tenant, membership.user, role)
    return membership


def _withdraw_invitations(tenant: Tenant, sender, role: str | None) -> None:
    """Withdraw the open invitations `sender` sent that their role (None: no longer a member)
    may no longer send: an invitation must not outlive its sender's authority."""
    open_ones = Invitation.objects.filter(
        tenant=tenant, invited_by=sender, accepted_at__isnull=True, revoked_at__isnull=True
    )
    withdrawn = [
        invitation.pk
        for invitation in open_ones
        if role is None or not may_invite(role, invitation.role)
    ]
    Invitation.objects.filter(pk__in=withdrawn).update(revoked_at=timezone.now())


@transaction.atomic
def remove_member(membership: Membership) -> None:
    owners = locks.owners(membership.tenant)
    membership.refresh_from_db()
    if membership.role == Role.OWNER and len(owners) <= 1:
        raise ValidationError("The last owner cannot be removed.")
    ApiToken.objects.filter(user=membership.user, tenant=membership.tenant).update(
        revoked_at=timezone.now()
    )
    _withdraw_invitations(membership.tenant, membership.user, None)
    membership.delete()


@transaction.atomic
def ensure_user(username: str, password: str | None = None, email: str = "", **extra) -> "User":
    """Create the user if missing; set the password when one is given. The username and the
    password pass the same validators as the admin's forms (AUTH_PASSWORD_VALIDATORS)."""
    user = User.objects.filter(username=username).first()
    if user is None:
        user = User(username=username, email=email, **extra)
        user.set_unusable_password()
        user.full_clean(exclude=["password"])
    if password:
        try:
            validate_password(password, user)
        except ValidationError as error:
            raise ValidationError({"password": error.messages}) from None
        user.set_password(password)
    user.save()
    return user


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    raw: str  # shown to the user once, never stored


@transaction.atomic
def issue_token(
    user,
    tenant: Tenant,
    name: str,
    expires_at: datetime | None = None,
    *,
    read_only=False,
    scopes: list[str] | None = None,
    instance_prefix: str = "",
    issuer: ApiToken | None = None,
) -> IssuedToken:
    """A token for ``user`` in ``tenant``; a viewer's is read-only whatever was asked.
    ``scopes`` (None: unscoped) limit it to those actions, ``instance_prefix`` to the
    instances whose name starts with it (accounts.scopes). A token issued by another token
    (``issuer``, through the API) never exceeds it: read-only if it is, no scope it lacks, a
    prefix inside its prefix, an expiry no later than its own."""
    membership = Membership.objects.filter(user=user, tenant=tenant).first()
    if membership is None:
        raise ValidationError(f"{user.username} is not a member of {tenant}.")
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": "The expiry must be in the future."})
    read_only = read_only or not membership.can(OPERATE) or bool(issuer and issuer.read_only)
    instance_prefix = scope_rules.clean_prefix(instance_prefix)
    if scopes is not None:
        role = Role.VIEWER if read_only else membership.role
        scopes = scope_rules.clean_scopes(
            scopes, role, read_only=read_only, instance_prefix=instance_prefix
        )
    if issuer is not None:
        expires_at = _within_issuer(issuer, scopes, instance_prefix, expires_at)
        scopes = scopes if scopes is not None else issuer.scopes
    prefix = secrets.token_hex(4)
    raw = f"{ApiToken.PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    token = ApiToken(
        user=user,
        tenant=tenant,
        name=name.strip(),
        prefix=prefix,
        token_hash=hash_token(raw),
        expires_at=expires_at,
        read_only=read_only,
        scopes=scopes,
        instance_prefix=instance_prefix,
        issued_by=issuer,
    )
    token.full_clean()
    token.save()
    return IssuedToken(token=token, raw=raw)


def _within_issuer(
    issuer: ApiToken, scopes: list[str] | None, instance_prefix: str, expires_at
) -> datetime | None:
    """The expiry of a token that ``issuer`` creates (no later than its own); ValidationError
    where it would exceed the issuer."""
    beyond = [
        name
        for name in scopes or []
        if not all(
            scope_rules.grants(issuer.scopes, scope.name) for scope in scope_rules.covered(name)
        )
    ]
    if beyond:
        raise ValidationError(
            {"scopes": f"This token cannot grant what it lacks: {', '.join(beyond)}."}
        )
    if not instance_prefix.startswith(issuer.instance_prefix):
        raise ValidationError(
            {
                "instance_prefix": "This token is confined to instances named "
                f"{issuer.instance_prefix}…: the new one must be too."
            }
        )
    if issuer.expires_at is not None:
        if expires_at is not None and expires_at > issuer.expires_at:
            raise ValidationError(
                {"expires_at": "The expiry cannot be later than this token's own."}
            )
        expires_at = expires_at or issuer.expires_at
    return expires_at


@transaction.atomic
def revoke_token(token: ApiToken) -> ApiToken:
    """Revokes the token and, with it, every token it issued (and theirs): what a token
    created cannot outlive it."""
    now = timezone.now()
    pks = [token.pk]
    while pks:
        ApiToken.objects.filter(pk__in=pks, revoked_at__isnull=True).update(revoked_at=now)
        pks = list(ApiToken.objects.filter(issued_by__in=pks).values_list("pk", flat=True))
    token.refresh_from_db(fields=["revoked_at"])
    if token.revoked_at == now:  # revoked by this call: its issued tokens went with it
        audit.record("apitoken.revoke", token, after={"revoked_at": now})
    return token


class TokenRejected(DomainError):
    code = ErrorCode.INVALID_TOKEN
    status = 401


# Every API request asks this, compiled once (console/speedups/prepared.py): the token with its
# tenant, its user and the membership it acts as (the user's in that tenant, if any: one at most).
_TOKENS = Prepared(
    ApiToken.objects.annotate(
        member=FilteredRelation(
            "tenant__memberships", condition=Q(tenant__memberships__user=F("user"))
        )
    )
    .order_by()
    .values_list(
        *columns(ApiToken), *columns(Tenant, "tenant__"), *columns(User, "user__"),
        *columns(Membership, "member__"),
    )
)  # fmt: skip


def authenticate_token(raw: str) -> tuple[ApiToken, Membership]:
    """The token and the membership it acts as, or TokenRejected saying why."""
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != ApiToken.PREFIX or len(parts[1]) != 8:
        raise TokenRejected("Malformed API token.", code=ErrorCode.INVALID_TOKEN)
    found = _TOKENS.filter(prefix=parts[1])[:1]
    if not found:
        raise TokenRejected("Unknown API token.", code=ErrorCode.INVALID_TOKEN)
    token, token.tenant, token.user, membership = instances(
        found[0], ApiToken, Tenant, User, Membership
    )
    if not secrets.compare_digest(token.token_hash, hash_token(raw)):
        raise TokenRejected("Unknown API token.", code=ErrorCode.INVALID_TOKEN)
    if token.is_revoked:
        raise TokenRejected("This API token has been revoked.", code=ErrorCode.TOKEN_REVOKED)
    if token.is_expired():
        raise TokenRejected("This API token has expired.", code=ErrorCode.TOKEN_EXPIRED)
    if membership.pk is None or not token.user.is_active:
        detail = "The token's user no longer belongs to its tenant."
        raise TokenRejected(detail, code=ErrorCode.INVALID_TOKEN)
    membership.user, membership.tenant = token.user, token.tenant
    if not token.tenant.is_active:
        detail = f"Tenant {token.tenant.slug} is suspended."
        raise TokenRejected(detail, code=ErrorCode.TENANT_SUSPENDED)
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    if token.read_only:  # the request acts with the token's role: every check sees a viewer
        membership.role = Role.VIEWER
    membership.api_token = token  # its scopes and prefix limit what the request may do
    return token, membership


def access_stands(membership_id: int, token_id: int | None = None) -> bool:
    """Whether an access granted earlier (an open websocket) still holds: the membership is
    there, its user and its tenant active, and the token it came with (if any) neither revoked
    nor expired."""
    active = Membership.objects.filter(
        pk=membership_id, tenant__status=Tenant.Status.ACTIVE, user__is_active=True
    )
    if not active.exists():
        return False
    if token_id is None:
        return True
    token = ApiToken.objects.filter(pk=token_id).first()
    return token is not None and not token.is_revoked and not token.is_expired()


def operator_stands(user_id: int) -> bool:
    """Whether an operator's access granted earlier (an open websocket) still holds."""
    return User.objects.filter(pk=user_id, is_active=True, is_staff=True).exists()
