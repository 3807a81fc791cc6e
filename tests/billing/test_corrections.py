"""A correction that arrives after issue (issue 27): the issued invoice stands, and the
difference is a line on the next open month's invoice, naming the invoice and the
instance, counted alike by the usage page, the API, the budget and the invoice; the meter
adds it once however often it runs."""

from decimal import Decimal

import pytest

from billing import budgets, services
from billing.documents import parse_invoice_csv
from billing.exports import export, with_so_far
from billing.metering import end_at_last_heartbeat
from billing.models import Invoice, UsageCorrection
from billing.usage import usage_report
from console.instances.models import State
from tests.billing.conftest import at, move

S = State


@pytest.fixture(autouse=True)
def no_disk_price(settings):
    settings.BILLING_DISK_PRICE_PER_GIB_MONTH = Decimal("0")


def test_a_late_failover_after_issue_is_a_line_on_the_next_invoice(world, tenant):
    box = world.running(tenant, at(2026, 1, 31, 20))  # 0.90 per hour
    services.run_meter(at(2026, 2, 1, 1))
    services.finalize_due(at(2026, 2, 1, 1))
    january = Invoice.objects.get(tenant=tenant, month=at(2026, 1, 1).date())
    assert january.subtotal == Decimal("3.60")  # 20:00 to midnight
    # The host had gone silent at 21:00; the stop clicked meanwhile is noticed at 02:00.
    move(box, S.STOPPING, at(2026, 2, 1, 2))
    end_at_last_heartbeat(box, at(2026, 1, 31, 21))
    move(box, S.STOPPED, at(2026, 2, 1, 2))
    now = at(2026, 2, 1, 3)
    services.run_meter(now)
    services.run_meter(now)  # once only
    february = at(2026, 2, 1).date()
    report = usage_report(tenant, february, now)
    (line,) = [line for line in report.lines if line.kind == "gpu"]
    assert (line.seconds, line.amount) == (-3 * 3600, Decimal("-2.700000"))
    assert january.number in line.description and box.name in line.description
    assert UsageCorrection.objects.count() == 1
    draft = Invoice.objects.get(tenant=tenant, month=february)
    assert with_so_far([draft], now)[0].so_far.amount == Decimal("-2.700000")
    assert budgets.month_to_date(tenant, now) == Decimal("-2.700000")
    assert budgets.spent_this_month([tenant.pk], now) == {tenant.pk: Decimal("-2.700000")}
    assert parse_invoice_csv(export(draft, "csv", now=now).content.decode()).subtotal == Decimal(
        "-2.70"
    )
    services.finalize_due(at(2026, 3, 1, 1))
    draft.refresh_from_db()
    (issued,) = draft.lines.filter(kind="gpu")
    assert (issued.description, issued.amount) == (line.description, line.amount)
    assert draft.subtotal == Decimal("-2.70")
    january.refresh_from_db()
    assert january.subtotal == Decimal("3.60")  # the issued invoice stands
    assert usage_report(tenant, february, at(2026, 3, 2)).total == Decimal("-2.700000")
