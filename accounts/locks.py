"""Row locks of accounts' tables. Every transaction that locks several kinds of rows takes
them in one order, each kind in primary-key order:

    accounts (a tenant's Quota, its owners' memberships, an invitation)
    → instances (Instance rows: console/instances/locks.py)
    → an instance's idle watch (console/idle/locks.py)
    → volumes (console/volumes/locks.py)
    → snapshots' shelves, then snapshots, schedules, restores (console/snapshots/locks.py)
    → fleet (a Host, then its Gpu rows: console/fleet/locks.py)
    → billing (budget alerts, invoice sequences, invoices, credit grants, usage segments:
      billing/locks.py)

Notification endpoints (console/notifications/locks.py) are locked alone. Nothing else calls
select_for_update (tests/test_locks.py checks)."""

from accounts.models import Invitation, Membership, Quota, Tenant
from accounts.roles import Role


def quota(tenant_id: int) -> Quota:
    """The tenant's quota row: it serialises the tenant's launches, starts and resizes (and
    its budget's changes), so it is always taken first."""
    return Quota.objects.select_for_update().get(tenant_id=tenant_id)


def owners(tenant: Tenant) -> list[Membership]:
    return list(
        Membership.objects.select_for_update().filter(tenant=tenant, role=Role.OWNER).order_by("pk")
    )


def invitation(pk: int) -> Invitation:
    return Invitation.objects.select_for_update().select_related("tenant").get(pk=pk)
