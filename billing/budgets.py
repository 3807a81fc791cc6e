"""Monthly budgets (``Quota.monthly_budget``): alerts at 50, 80 and 100 % of the budget in
force, each at most once per tenant, month and budget (a unique ``BudgetAlert`` row: a raised
budget alerts again at its own thresholds), by email to the tenant's owners and admins and as
a notice in the console, stating the highest level reached; and, when the tenant chose
``budget_action = stop``, at 100 % new launches are refused (``ensure_launch_allowed``) and
running instances are stopped (``enforce``, from a Celery task).

Spend is ``spent_this_month``: the usage page's total as of the same moment
(``usage.so_far``, rated live, volumes and snapshots included). The alerts and the stop
(``check_budgets``), the enforcement, the launch check and the banner all read it, so they
agree with the usage page at any instant. ``check_budgets`` runs in the minute meter for every
tenant with a budget, and for one tenant right after its budget changed (``services.set_budget``
queues ``billing.tasks.check_budget``), so a crossing is acted on within a metering interval.
"""

import logging
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from accounts.models import Membership, Quota, Tenant
from accounts.roles import Role
from billing import locks
from billing.models import BudgetAlert, BudgetNoticeDismissal
from billing.money import format_money
from billing.rating import month_start
from billing.usage import so_far
from console.celery import enqueue_on_commit
from console.errors import DomainError, ErrorCode
from console.instances import reasons
from console.instances.models import Instance, State
from console.notices import notice as notices

log = logging.getLogger(__name__)

THRESHOLDS = BudgetAlert.THRESHOLDS
# What enforcement stops: what runs, and what waits to run.
STOPPABLE = (State.RUNNING, State.PENDING)
# An alert whose email has not gone out this long after it fired is sent again.
RESEND_AFTER = timedelta(minutes=2)


def spent_this_month(tenant_ids, now: datetime) -> dict[int, Decimal]:
    """Each tenant's spend in the UTC month of ``now`` as of ``now`` (6 places): the usage
    page's total at that moment, volumes and snapshots included. Every budget figure is this
    one."""
    figures = so_far(tenant_ids, month_start(now).date(), now)
    return {tenant_id: figure.amount for tenant_id, figure in figures.items()}


def month_to_date(tenant: Tenant, now: datetime | None = None) -> Decimal:
    """What the tenant has spent this UTC month as of ``now`` (6 places)."""
    now = now or timezone.now()
    return spent_this_month([tenant.pk], now)[tenant.pk]


def crossed(spent: Decimal, budget: Decimal) -> list[int]:
    """The thresholds (percent) that ``spent`` has reached."""
    if budget <= 0 and spent <= 0:
        return []
    return [threshold for threshold in THRESHOLDS if spent * 100 >= budget * threshold]


def is_exhausted(spent: Decimal, budget: Decimal | None) -> bool:
    return budget is not None and spent >= budget


class BudgetExceeded(DomainError):
    code = ErrorCode.BUDGET_EXCEEDED


def ensure_launch_allowed(tenant: Tenant) -> None:
    """Raise ``BudgetExceeded`` when the tenant chose to stop at its
    budget and has spent it this month. A launch check (console.instances.hooks, registered
    in BillingConfig.ready): launches, starts and resizes that ask for more run it."""
    quota = Quota.objects.filter(tenant_id=tenant.pk).values_list("monthly_budget", "budget_action")
    budget, action = quota.first() or (None, Quota.BudgetAction.ALERT)
    if budget is None or action != Quota.BudgetAction.STOP:
        return
    spent = month_to_date(tenant)
    if is_exhausted(spent, budget):
        currency = settings.BILLING_CURRENCY
        raise BudgetExceeded(
            f"{tenant.name} has spent {format_money(spent, currency)} of its monthly budget "
            f"of {format_money(budget, currency)}; "
            "new launches are refused until an owner raises the budget or the month ends."
        )


def check_budgets(now: datetime | None = None, tenant_ids=None) -> list[BudgetAlert]:
    """Record every threshold of the budget in force that the month's spend as of ``now``
    reaches and that has no alert yet, then, after commit, email and notify each tenant once,
    at the highest level it reached; and queue enforcement for tenants that chose to stop, are
    at 100 % and still have something running. For the given tenants (None: every tenant with
    a budget, the meter's minute pass). Answers the alerts created."""
    now = now or timezone.now()
    month = month_start(now).date()
    quotas = Quota.objects.filter(monthly_budget__isnull=False)
    if tenant_ids is not None:
        quotas = quotas.filter(tenant_id__in=tenant_ids)
    budgets = {
        tenant_id: (budget, action)
        for tenant_id, budget, action in quotas.values_list(
            "tenant_id", "monthly_budget", "budget_action"
        )
    }
    if not budgets:
        return []
    spent = spent_this_month(list(budgets), now)
    fired = set(
        BudgetAlert.objects.filter(month=month, tenant_id__in=list(budgets)).values_list(
            "tenant_id", "threshold", "budget"
        )
    )
    created: list[BudgetAlert] = []
    to_enforce: list[int] = []
    with transaction.atomic():
        for tenant_id, (budget, action) in sorted(budgets.items()):
            amount = spent[tenant_id]
            new = [t for t in crossed(amount, budget) if (tenant_id, t, budget) not in fired]
            for threshold in new:
                alert, was_created = BudgetAlert.objects.get_or_create(
                    tenant_id=tenant_id,
                    month=month,
                    threshold=threshold,
                    budget=budget,
                    defaults={"spent": amount, "created_at": now},
                )
                if was_created:
                    created.append(alert)
            if action == Quota.BudgetAction.STOP and is_exhausted(amount, budget):
                to_enforce.append(tenant_id)
        highest: dict[int, BudgetAlert] = {}
        for alert in created:  # one email per tenant: the highest threshold reached
            if (
                alert.tenant_id not in highest
                or alert.threshold > highest[alert.tenant_id].threshold
            ):
                highest[alert.tenant_id] = alert
        lost = BudgetAlert.objects.filter(
            tenant_id__in=list(budgets), emailed_at__isnull=True, created_at__lt=now - RESEND_AFTER
        ).values_list("pk", flat=True)
        to_send = sorted({alert.pk for alert in highest.values()} | set(lost))
        for alert_pk in to_send:
            enqueue_on_commit("billing.tasks.send_budget_alert", alert_pk)
        for alert in highest.values():
            threshold = threshold_notice(alert)
            transaction.on_commit(lambda n=threshold: notices.send(sender=__name__, **n))
        running = sorted(
            set(
                Instance.objects.filter(tenant_id__in=to_enforce, state__in=STOPPABLE)
                .values_list("tenant_id", flat=True)
                .distinct()
            )
        )
        for tenant_id in running:
            enqueue_on_commit("billing.tasks.enforce_budget", tenant_id)
    for alert in created:
        log.info(
            "tenant %s reached %s%% of its budget (%s of %s)",
            alert.tenant_id,
            alert.threshold,
            alert.spent,
            alert.budget,
        )
    return created


def recipients(tenant_id: int) -> list[str]:
    """Owners' and admins' email addresses."""
    return sorted(
        set(
            Membership.objects.filter(tenant_id=tenant_id, role__in=[Role.OWNER, Role.ADMIN])
            .exclude(user__email="")
            .values_list("user__email", flat=True)
        )
    )


def threshold_notice(alert: BudgetAlert) -> dict:
    """The `budget.threshold` notice's arguments (console.notices)."""
    currency = settings.BILLING_CURRENCY
    spent, budget = format_money(alert.spent, currency), format_money(alert.budget, currency)
    return {
        "tenant": alert.tenant_id,
        "kind": "budget.threshold",
        "subject": None,
        "text": f"Spending in {alert.month:%B %Y} reached {alert.threshold}% of the monthly "
        f"budget: {spent} of {budget}.",
        "data": {
            "threshold": alert.threshold,
            "month": alert.month.isoformat(),
            "spent": str(alert.spent),
            "budget": str(alert.budget),
            "currency": currency,
        },
    }


def alert_message(alert: BudgetAlert, tenant: Tenant, action: str) -> tuple[str, str]:
    currency = settings.BILLING_CURRENCY
    subject = f"[gpucloud] {tenant.name} reached {alert.threshold}% of its monthly budget"
    lines = [
        "Hello,",
        "",
        f"{tenant.name} has spent {format_money(alert.spent, currency)} in "
        f"{alert.month:%B %Y}, {alert.threshold}% of its monthly budget of "
        f"{format_money(alert.budget, currency)}.",
        "",
    ]
    if action == Quota.BudgetAction.STOP:
        lines.append(
            "At 100% new launches are refused and running instances are stopped, as the "
            "tenant chose."
        )
    else:
        lines.append("At 100% you are alerted only; instances keep running.")
    lines += ["", "See the usage page of the console: /billing/usage/", "", "-- gpucloud billing"]
    return subject, "\n".join(lines)


def send_alert(alert_pk: int, now: datetime | None = None) -> bool:
    """Email one alert (and mark lower thresholds of the same month and budget, which it
    covers, as sent). At most once: the row is locked and ``emailed_at`` set in one transaction."""
    now = now or timezone.now()
    with transaction.atomic():
        alert = locks.unsent_alert(alert_pk)
        if alert is None:
            return False
        tenant = alert.tenant
        to = recipients(tenant.pk)
        if to:
            subject, body = alert_message(alert, tenant, tenant.quota.budget_action)
            send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, to)
        BudgetAlert.objects.filter(
            tenant_id=alert.tenant_id,
            month=alert.month,
            budget=alert.budget,
            threshold__lte=alert.threshold,
            emailed_at__isnull=True,
        ).update(emailed_at=now)
    return True


def enforce(tenant_id: int) -> int:
    """Stop what a tenant over its budget (with ``budget_action = stop``) still runs.
    Checks again first: a raised budget or a new month stops nothing. Answers how many
    instances were asked to stop."""
    from console.instances import services as instance_services

    quota = Quota.objects.filter(tenant_id=tenant_id).select_related("tenant").first()
    if quota is None or quota.budget_action != Quota.BudgetAction.STOP:
        return 0
    spent = month_to_date(quota.tenant)
    if not is_exhausted(spent, quota.monthly_budget):
        return 0
    currency = settings.BILLING_CURRENCY
    why = reasons.budget_stopped(
        format_money(quota.monthly_budget, currency), format_money(spent, currency)
    )

    def stop(instance: Instance) -> bool:
        try:
            instance_services.stop_instance(instance, actor=None, reason=why)
        except DomainError as error:
            log.info("budget stop of instance %s skipped: %s", instance.pk, error)
            return False
        stopped_notice = {
            "tenant": tenant_id,
            "kind": "instance.budget_stopped",
            "subject": instance,
            "text": f"{instance.name}: {reasons.explain(why)}",
            "data": {
                "instance_id": instance.pk,
                "instance_name": instance.name,
                "reason": why.text,
            },
        }
        transaction.on_commit(lambda: notices.send(sender=__name__, **stopped_notice))
        return True

    stopped = instance_services.stop_all(quota.tenant, STOPPABLE, stop)
    if stopped:
        log.warning("tenant %s is over its budget: %d instance(s) stopping", tenant_id, stopped)
    return stopped


@dataclass(frozen=True)
class Notice:
    """The budget banner as a member sees it now: the highest threshold (``level``) that the
    month's spend reaches of the current budget."""

    tenant_name: str
    level: int
    spent: Decimal
    budget: Decimal
    stopping: bool  # at 100 % with budget_action stop: launches refused, instances stopped

    @property
    def percent(self) -> int | None:
        return int(self.spent * 100 / self.budget) if self.budget else None


def notice(membership: Membership, now: datetime | None = None) -> Notice | None:
    """The banner on every page for ``membership``, from the current budget and the spend so
    far (so a raised budget takes it away at once, for every member); None when the spend
    reaches no threshold, there is no budget, or the member dismissed this level."""
    now = now or timezone.now()
    quota = Quota.objects.filter(tenant_id=membership.tenant_id).values_list(
        "monthly_budget", "budget_action"
    )
    budget, action = quota.first() or (None, Quota.BudgetAction.ALERT)
    if budget is None:
        return None
    tenant = membership.tenant
    spent = month_to_date(tenant, now)
    levels = crossed(spent, budget)
    if not levels or _dismissed(membership, month_start(now).date(), levels[-1], budget):
        return None
    level = levels[-1]
    stopping = level >= 100 and action == Quota.BudgetAction.STOP
    return Notice(tenant.name, level, spent, budget, stopping)


def _dismissed(membership: Membership, month: date, level: int, budget: Decimal) -> bool:
    return BudgetNoticeDismissal.objects.filter(
        membership_id=membership.pk, month=month, threshold=level, budget=budget
    ).exists()


def dismiss_notice(membership: Membership, level: int, now: datetime | None = None) -> bool:
    """The member hides the banner at ``level``, the one it saw; a level that is no longer
    the current one (the spend or the budget moved meanwhile) is not dismissed. Answers
    whether it was."""
    now = now or timezone.now()
    current = notice(membership, now)
    if current is None or current.level != level:
        return False
    BudgetNoticeDismissal.objects.get_or_create(
        membership_id=membership.pk,
        month=month_start(now).date(),
        threshold=level,
        budget=current.budget,
    )
    return True
