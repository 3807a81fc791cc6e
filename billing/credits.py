"""Credits: grants a tenant's next finalizations use (``finalize``), and what is left."""

from datetime import datetime
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from accounts.models import Tenant
from billing.models import CreditGrant
from billing.rating import ZERO, round_to_cents
from console.audit import recorder as audit

# what the audit log keeps of a grant
GRANT_FIELDS = ["kind", "amount", "description", "expires_at"]


def grant_credit(
    tenant: Tenant,
    amount: Decimal | str,
    *,
    kind: str = CreditGrant.Kind.PREPAID,
    description: str = "",
    expires_at: datetime | None = None,
    actor=None,
    now: datetime | None = None,
) -> CreditGrant:
    """Give a tenant credit; the next finalizations use it."""
    try:
        amount = Decimal(amount)
    except (ArithmeticError, TypeError, ValueError):
        raise ValidationError({"amount": "Give an amount such as 25.00."}) from None
    if not amount.is_finite() or amount <= 0 or round_to_cents(amount) != amount:
        raise ValidationError({"amount": "Give a positive amount in whole cents."})
    if kind not in CreditGrant.Kind.values:
        raise ValidationError({"kind": f"Choose one of {', '.join(CreditGrant.Kind.values)}."})
    now = now or timezone.now()
    if expires_at is not None and expires_at <= now:
        raise ValidationError({"expires_at": "The expiry must be in the future."})
    grant = CreditGrant(
        tenant=tenant,
        kind=kind,
        amount=amount,
        remaining=amount,
        description=description[:200],
        granted_by=actor if getattr(actor, "pk", None) else None,
        granted_at=now,
        expires_at=expires_at,
    )
    grant.full_clean()
    with transaction.atomic():
        grant.save()
        audit.record("creditgrant.grant", grant, after=audit.snapshot(grant, GRANT_FIELDS))
    return grant


def available_credit(tenant: Tenant) -> Decimal:
    now = timezone.now()
    total = (
        CreditGrant.objects.filter(tenant=tenant, remaining__gt=0)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .aggregate(total=Sum("remaining"))["total"]
    )
    return round_to_cents(total or ZERO)
