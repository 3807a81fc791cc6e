"""Billing's Celery tasks, routed to the ``billing`` queue (settings.CELERY_TASK_ROUTES).
Each takes primary keys or nothing and is idempotent: running it twice, or a redelivery
after a crash, changes nothing."""

from celery import shared_task
from django.db import DatabaseError

from billing import budgets, services

OPTIONS = {
    "ignore_result": True,
    "acks_late": True,
    "reject_on_worker_lost": True,
    "autoretry_for": (DatabaseError, OSError),  # OSError: SMTP failures too
    "retry_backoff": 5,
    "retry_backoff_max": 120,
    "max_retries": 5,
}


@shared_task(name="billing.tasks.meter", **OPTIONS)
def meter() -> None:
    """Every minute: repair segments, rate usage, check budgets."""
    services.run_meter()


@shared_task(name="billing.tasks.finalize_invoices", **OPTIONS)
def finalize_invoices() -> None:
    """Hourly: issue the invoices of every month that ended (after the grace period)."""
    services.run_meter()
    services.finalize_due()


@shared_task(name="billing.tasks.check_budget", **OPTIONS)
def check_budget(tenant_pk: int) -> None:
    """Right after a tenant's budget changed: its alerts and stop, as the meter's pass."""
    budgets.check_budgets(tenant_ids=[tenant_pk])


@shared_task(name="billing.tasks.send_budget_alert", **OPTIONS)
def send_budget_alert(alert_pk: int) -> None:
    budgets.send_alert(alert_pk)


@shared_task(name="billing.tasks.enforce_budget", **OPTIONS)
def enforce_budget(tenant_pk: int) -> None:
    budgets.enforce(tenant_pk)
