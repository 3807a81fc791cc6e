"""Billing's write functions, the ones views, the admin, receivers and tasks call.

Each is one transaction (or a series of idempotent ones) and safe to run twice:

- ``record_transition`` — open/close usage segments for an instance's state change;
- ``run_meter`` — repair segments from the event history, rate them, check budgets;
- ``finalize_month`` / ``finalize_due`` — issue a month's invoices;
- ``mark_paid``, ``void_invoice`` (answers the credit note), ``grant_credit``;
- ``set_budget`` — a tenant's monthly budget and what happens at 100 %, checked at once.

And ``stopped_disk_cost_per_month(instance)``, which the console shows before a stop.
"""

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from accounts import locks as account_locks
from accounts.models import Quota, Tenant
from billing import budgets, metering, storage
from billing.corrections import InvalidInvoiceState, mark_paid, void_invoice
from billing.credits import grant_credit
from billing.finalize import finalize_due, finalize_month
from billing.metering import record_transition
from billing.usage import disk_cost_per_month
from console.celery import enqueue_on_commit
from console.instances.models import Instance

__all__ = [
    "InvalidInvoiceState",
    "MeterResult",
    "finalize_due",
    "finalize_month",
    "grant_credit",
    "mark_paid",
    "record_transition",
    "run_meter",
    "set_budget",
    "stopped_disk_cost_per_month",
    "void_invoice",
]


def stopped_disk_cost_per_month(instance: Instance) -> Decimal:
    """What the instance's disk costs per month while it does not run (6 places): shown
    before a user stops it. ``BILLING_DISK_PRICE_PER_GIB_MONTH`` × its disk (sized at launch,
    grown only when asked: a resize does not change it)."""
    return disk_cost_per_month(instance.disk_gib or instance.spec.disk_gib)


@dataclass(frozen=True)
class MeterResult:
    repaired: int
    pieces_written: int
    alerts: int


def run_meter(now: datetime | None = None) -> MeterResult:
    """The minute job: repair segments from the event history, rate what is open or not
    yet rated, then check budgets. Running it twice at the same moment changes nothing."""
    now = now or timezone.now()
    repaired = metering.reconcile(now)
    written = metering.rate_pending(now)
    storage.ensure_current_drafts(now)
    alerts = budgets.check_budgets(now)
    return MeterResult(repaired, written, len(alerts))


def set_budget(
    tenant: Tenant, monthly_budget: Decimal | None, budget_action: str, *, actor=None
) -> Quota:
    """An owner's choice: the monthly budget (None: no budget) and alert-or-stop at 100 %.
    After commit the tenant's spend is checked against it (``budgets.check_budgets``, through
    Celery as the meter does): a budget lowered below the spend alerts and stops at once."""
    if budget_action not in Quota.BudgetAction.values:
        raise ValidationError({"budget_action": "Choose alert or stop."})
    with transaction.atomic():
        quota = account_locks.quota(tenant.pk)
        quota.monthly_budget = monthly_budget
        quota.budget_action = budget_action
        quota.full_clean()
        quota.save(update_fields=["monthly_budget", "budget_action"])
        enqueue_on_commit("billing.tasks.check_budget", tenant.pk)
    return quota
