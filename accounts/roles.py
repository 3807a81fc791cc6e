"""Roles inside a tenant and what each may do. Higher roles can do everything lower ones can."""

from django.db import models


class Role(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    MEMBER = "member", "Member"
    ADMIN = "admin", "Admin"
    OWNER = "owner", "Owner"


RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3}

# What each kind of action needs. Views and services name the action, not the role.
READ = Role.VIEWER  # see instances, usage, invoices
OPERATE = Role.MEMBER  # launch and operate instances
MANAGE = Role.ADMIN  # members and API tokens
BILLING = Role.OWNER  # budgets and billing settings


def at_least(role: str, needed: str) -> bool:
    return RANK[Role(role)] >= RANK[Role(needed)]


def may_invite(inviter_role: str, role: str) -> bool:
    """Whether a member with `inviter_role` may invite someone as `role`: admins and owners
    invite, only owners invite owners."""
    return at_least(inviter_role, MANAGE) and (role != Role.OWNER or inviter_role == Role.OWNER)
