"""One figure for "the month so far": the usage page (month to date and the budget's spend),
the tenant's invoice page and list, the operators' admin list and the API all show the same
total at one instant, rated live (the meter's stored pieces lag up to a minute behind)."""

import re
from decimal import Decimal

import pytest
import time_machine
from django.test import Client

from accounts.models import Quota
from accounts.roles import Role
from billing import budgets, services
from billing.models import BudgetAlert, Invoice
from billing.usage import so_far
from tests.billing.conftest import at
from tests.factories import UserFactory
from tests.web.test_console_pages import login

pytestmark = pytest.mark.django_db

METERED = at(2026, 4, 15, 12)  # the meter's last run
NOW = at(2026, 4, 15, 12, 0, 30)  # 2 h 30 s of 3.20/h: 6.426667 so far; the meter stored 6.40


def _testid(html: str, testid: str) -> str:
    match = re.search(rf'data-testid="{testid}">([^<]+)<', html)
    assert match, f"no {testid} on the page"
    return match.group(1)


@pytest.fixture
def running(world, tenant, other_tenant):
    world.running(tenant, at(2026, 4, 15, 10), spec=world.whole, name="infer")
    world.running(other_tenant, at(2026, 4, 15, 11), spec=world.quarter, name="theirs")
    services.run_meter(METERED)
    Quota.objects.filter(tenant=tenant).update(monthly_budget=Decimal("100.00"))
    return Invoice.objects.get(tenant=tenant, month=at(2026, 4, 1).date())


def test_every_page_and_the_api_show_the_same_month_so_far(
    client, running, tenant, make_member, token_client
):
    member = make_member(tenant, Role.VIEWER)
    login(client, member)
    api = token_client(member)
    operator = Client()
    operator.force_login(UserFactory(is_staff=True, is_superuser=True))
    with time_machine.travel(NOW, tick=False):
        usage = client.get("/billing/usage/").content.decode()
        invoice_page = client.get(f"/billing/invoices/{running.pk}/").content.decode()
        invoice_list = client.get("/billing/invoices/").content.decode()
        admin_list = operator.get("/admin/billing/invoice/").content.decode()
        admin_page = operator.get(f"/admin/billing/invoice/{running.pk}/change/").content.decode()
        api_usage = api.get("/api/v1/usage/").json()
        api_list = api.get("/api/v1/invoices/").json()["results"]
        api_detail = api.get(f"/api/v1/invoices/{running.pk}/").json()
        spent = budgets.month_to_date(tenant)

    assert so_far([tenant.pk], running.month, NOW)[tenant.pk].amount == Decimal("6.426667")
    assert spent == Decimal("6.426667")  # what the budget counts, not the stored 6.40
    assert _testid(usage, "month-to-date") == "6.43 USD"
    assert _testid(usage, "budget-spent") == "6.43 USD"
    assert "As of 2026-04-15 12:00 UTC" in usage
    assert _testid(invoice_page, "invoice-total") == "6.43 USD"
    assert _testid(invoice_page, "as-of") == "2026-04-15 12:00:30"
    assert _testid(invoice_list, f"so-far-{running.pk}") == "6.43 USD"
    assert "so far, as of 12:00 UTC" in invoice_list
    assert "6.43 USD <span" in admin_list and "so far at 12:00 UTC" in admin_list
    assert 'title="the month so far, as of 2026-04-15 12:00:30 UTC"' in admin_list
    assert "6.43 USD <span" in admin_page  # the draft's own page too, not its stored 0.00
    assert api_usage["total"] == "6.426667" and api_usage["as_of"] == "2026-04-15T12:00:30Z"
    [draft] = [row for row in api_list if row["id"] == running.pk]
    assert (draft["total"], draft["subtotal"], draft["as_of"]) == (
        "6.43",
        "6.43",
        "2026-04-15T12:00:30Z",
    )
    assert api_detail["total"] == "6.43"
    assert sum(Decimal(line["amount"]) for line in api_detail["lines"]) == Decimal("6.426667")


def test_the_admin_list_rates_every_draft_at_once(
    running, other_tenant, django_assert_max_num_queries
):
    operator = Client()
    operator.force_login(UserFactory(is_staff=True, is_superuser=True))
    with time_machine.travel(NOW, tick=False), django_assert_max_num_queries(20):
        admin_list = operator.get("/admin/billing/invoice/").content.decode()
    assert "6.43 USD <span" in admin_list  # acme: 2 h 30 s at 3.20
    assert "0.91 USD <span" in admin_list  # globex: 1 h 30 s at 0.90 = 0.9075
    assert "0.00 <span" not in admin_list


def test_the_meter_alerts_on_the_same_figure(running, tenant, other_tenant):
    Quota.objects.filter(tenant=tenant).update(monthly_budget=Decimal("10.00"))
    services.run_meter(NOW)
    figures = so_far([tenant.pk, other_tenant.pk], running.month, NOW)
    spent = budgets.spent_this_month([tenant.pk, other_tenant.pk], NOW)
    assert spent == {pk: figure.amount for pk, figure in figures.items()}
    [alert] = BudgetAlert.objects.filter(tenant=tenant)
    assert (alert.threshold, alert.spent) == (50, Decimal("6.426667"))
