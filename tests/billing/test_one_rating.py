"""One rating path (issue 27, items 1 and 2): a price point back-dated into the open month
re-rates all of the month's usage of its spec, so the usage page, the API, the draft, the
budget and the issued invoice give one figure; and an issued month reads as issued (its
invoice's stored lines), whatever corrections arrive after."""

import re
from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine
from django.utils.html import escape

from accounts.roles import Role
from billing import budgets, services
from billing.documents import parse_invoice_csv
from billing.exports import export
from billing.metering import end_at_last_heartbeat
from billing.models import Invoice
from billing.usage import so_far, usage_report
from console.catalog.admin import PRICE_CHANGE_RULE
from console.catalog.models import SpecPrice
from console.instances.models import State
from tests.billing.conftest import at, walk
from tests.factories import SpecFactory, UserFactory
from tests.web.test_console_pages import login

pytestmark = pytest.mark.django_db

MARCH = at(2026, 3, 1).date()
ISSUE = at(2026, 4, 1, 1)  # after the month and its grace


def _run_ten_hours(world, tenant, spec, day: int):
    box = world.running(tenant, at(2026, 3, day, 8), spec=spec)
    walk(box, [State.TERMINATING, State.TERMINATED], at(2026, 3, day, 18))
    return box


@pytest.fixture
def spec(world):
    with time_machine.travel(at(2026, 2, 1), tick=False):
        return SpecFactory(code="q-090", name="Q 0.90", price_per_hour=Decimal("0.90"))


def test_a_price_back_dated_into_the_open_month_re_rates_all_of_its_usage(
    world, tenant, spec, client, make_member, token_client
):
    """The issue's example: 2 × 10 h at 0.90, then (Mar 5) 2.00 effective Mar 1. The first
    run was already rated and stored when the price came; it is rated again like the second."""
    _run_ten_hours(world, tenant, spec, 2)
    services.run_meter(at(2026, 3, 2, 19))  # the first run is rated and stored at 0.90
    _run_ten_hours(world, tenant, spec, 3)
    with time_machine.travel(at(2026, 3, 5), tick=False):
        point = SpecPrice(spec=spec, effective_from=at(2026, 3, 1), price_per_hour=Decimal("2"))
        point.full_clean()  # allowed: the open month
        point.save()
    services.run_meter(at(2026, 3, 5, 0, 1))

    now = at(2026, 3, 5, 0, 2)
    assert usage_report(tenant, MARCH, now).total == Decimal("40.000000")
    assert so_far([tenant.pk], MARCH, now)[tenant.pk].amount == Decimal("40.000000")
    member = make_member(tenant, Role.VIEWER)
    with time_machine.travel(now, tick=False):
        assert budgets.month_to_date(tenant) == Decimal("40.000000")
        assert token_client(member).get("/api/v1/usage/").json()["total"] == "40.000000"

    services.finalize_month(MARCH, now=ISSUE)
    invoice = Invoice.objects.get(tenant=tenant, month=MARCH)
    assert invoice.subtotal == Decimal("40.00")
    assert [line.amount for line in invoice.lines.all()] == [Decimal("20")] * 2
    assert parse_invoice_csv(export(invoice, "csv").content.decode()).subtotal == Decimal("40.00")
    login(client, member)
    with time_machine.travel(ISSUE + timedelta(days=3), tick=False):
        assert usage_report(tenant, MARCH).total == Decimal("40.000000")
        assert token_client(member).get("/api/v1/usage/?month=2026-03").json()["total"] == (
            "40.000000"
        )
        page = client.get("/billing/usage/?month=2026-03").content.decode()
    shown = re.search(r'data-testid="month-to-date">([^<]+)<', page).group(1)
    assert "40.00" in shown  # in whatever money format the page uses


def test_an_issued_month_reads_as_its_invoice_after_a_late_correction(
    world, tenant, spec, make_member, token_client
):
    """A failover noticed after March was issued pulls a stop back into March: March's usage
    page and API still say what the invoice says (the invoice stands)."""
    box = world.running(tenant, at(2026, 3, 31, 20), spec=spec)
    walk(box, [State.STOPPING, State.STOPPED], at(2026, 3, 31, 22))
    services.run_meter(ISSUE)
    services.finalize_month(MARCH, now=ISSUE)
    invoice = Invoice.objects.get(tenant=tenant, month=MARCH)
    issued = (invoice.subtotal, list(invoice.lines.values_list("seconds", "amount")))
    gpu = invoice.lines.get(kind="gpu")
    assert (gpu.seconds, gpu.amount) == (7200, Decimal("1.800000"))

    end_at_last_heartbeat(box, at(2026, 3, 31, 21))  # the host was silent from 21:00
    services.run_meter(ISSUE + timedelta(hours=1))

    invoice.refresh_from_db()
    assert (invoice.subtotal, list(invoice.lines.values_list("seconds", "amount"))) == issued
    later = ISSUE + timedelta(hours=2)
    report = usage_report(tenant, MARCH, later)
    assert report.total == sum(amount for _, amount in issued[1])
    assert [(line.seconds, line.amount) for line in report.lines] == issued[1]
    assert sum(day.amount for day in report.daily) == report.total
    assert report.forecast is None and report.accruing == []
    with time_machine.travel(later, tick=False):
        api = token_client(make_member(tenant, Role.VIEWER)).get("/api/v1/usage/?month=2026-03")
    assert Decimal(api.json()["total"]) == report.total
    assert [Decimal(line["amount"]) for line in api.json()["lines"]] == [a for _, a in issued[1]]


def test_the_price_admin_states_what_a_back_dated_price_does(world, spec, client):
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    page = client.get(f"/admin/catalog/spec/{spec.pk}/change/").content.decode()
    assert escape(PRICE_CHANGE_RULE) in page
    assert "re-rates all of this month's usage" in PRICE_CHANGE_RULE
