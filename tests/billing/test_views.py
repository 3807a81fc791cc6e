"""Console pages: usage (with the owners' budget form), invoices, downloads."""

import csv
import functools
import io
import re
from datetime import timedelta
from decimal import Decimal

import httpx
import pytest
import time_machine
from django.contrib.staticfiles import finders

from accounts.models import Quota
from accounts.roles import Role
from billing import budgets, services
from billing.models import BudgetAlert, Invoice
from billing.money import AS_RATED, format_money
from billing.usage import usage_report
from cli.main import main as cli_main
from console.instances.models import State
from tests.billing.conftest import at, move
from tests.conftest import ROLES
from tests.web.test_console_pages import flash, login

pytestmark = pytest.mark.django_db

S = State
NOW = at(2026, 4, 15, 12)


@pytest.fixture
def usage(world, tenant, other_tenant):
    box = world.running(tenant, at(2026, 3, 3, 8), name="train")
    move(box, S.TERMINATING, at(2026, 3, 3, 10))
    world.running(other_tenant, at(2026, 3, 5), name="secret")
    services.run_meter(at(2026, 4, 1, 1))
    services.finalize_month(at(2026, 3, 1).date(), now=at(2026, 4, 1, 2))
    world.running(tenant, at(2026, 4, 15, 10), spec=world.whole, name="infer")
    services.run_meter(NOW)
    return tenant


def test_plotly_is_served_locally():
    assert finders.find("vendor/plotly/plotly-basic.min.js")
    assert finders.find("js/billing.js")


def test_usage_page(client, usage, make_member):
    login(client, make_member(usage, Role.VIEWER))
    with time_machine.travel(NOW, tick=False):
        page = client.get("/billing/usage/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-testid="month-to-date">6.40 USD<' in html
    assert 'data-testid="rate">3.200000 USD<' in html
    assert "vendor/plotly/plotly-basic.min.js" in html and 'id="usage-daily"' in html
    assert "infer" in html and "a100-1x" in html and "secret" not in html
    assert "Only owners change the budget." in html  # viewers read only
    with time_machine.travel(NOW, tick=False):
        march = client.get("/billing/usage/?month=2026-03").content.decode()
    assert 'data-testid="month-to-date">1.80 USD<' in march and "GC-2026-000001" in march


def test_bad_month_falls_back_with_a_message(client, usage, make_member):
    login(client, make_member(usage, Role.VIEWER))
    response = client.get("/billing/usage/?month=2026-13")
    assert response.status_code == 200
    assert "Give a month between" in flash(response)


def test_owner_sets_the_budget(client, usage, make_member):
    login(client, make_member(usage, Role.OWNER))
    response = client.post(
        "/billing/usage/", {"budget-monthly_budget": "250.00", "budget-budget_action": "stop"}
    )
    assert response.status_code == 302
    quota = Quota.objects.get(tenant=usage)
    assert (quota.monthly_budget, quota.budget_action) == (Decimal("250.00"), "stop")


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"budget-monthly_budget": "-5", "budget-budget_action": "alert"}, "monthly_budget",
         "greater than or equal to 0"),
        ({"budget-monthly_budget": "1.234", "budget-budget_action": "alert"}, "monthly_budget",
         "2 decimal places"),
        ({"budget-monthly_budget": "5", "budget-budget_action": "panic"}, "budget_action",
         "Select a valid choice"),
    ],
)  # fmt: skip
def test_budget_form_shows_field_errors(client, usage, make_member, data, field, message):
    login(client, make_member(usage, Role.OWNER))
    response = client.post("/billing/usage/", data)
    assert response.status_code == 200
    assert message in str(response.context["form"].errors[field])
    assert message in response.content.decode()
    assert Quota.objects.get(tenant=usage).monthly_budget is None


@pytest.mark.parametrize("role", [r for r in ROLES if r != Role.OWNER])
def test_only_owners_change_the_budget(client, usage, make_member, role):
    login(client, make_member(usage, role))
    response = client.post(
        "/billing/usage/", {"budget-monthly_budget": "1", "budget-budget_action": "stop"}
    )
    assert response.status_code == 302
    assert "cannot do this" in flash(response)
    assert Quota.objects.get(tenant=usage).monthly_budget is None


def test_budget_notice(client, usage, make_member):
    login(client, make_member(usage, Role.MEMBER))
    services.set_budget(usage, Decimal("8.00"), "alert")
    with time_machine.travel(NOW, tick=False):
        services.run_meter()
        html = client.get("/billing/usage/").content.decode()
    assert BudgetAlert.objects.filter(tenant=usage).count() == 2
    assert "has used 80% of its monthly budget" in html


def test_invoice_pages_and_downloads(client, usage, make_member):
    login(client, make_member(usage, Role.VIEWER))
    with time_machine.travel(NOW, tick=False):
        listing = client.get("/billing/invoices/").content.decode()
    assert "GC-2026-000001" in listing and "Draft" in listing and "6.40" in listing
    invoice = Invoice.objects.get(number="GC-2026-000001")
    detail = client.get(f"/billing/invoices/{invoice.pk}/").content.decode()
    assert 'data-testid="invoice-total">1.80 USD<' in detail and "train" in detail
    download = client.get(f"/billing/invoices/{invoice.pk}/download/pdf/")
    assert download["Content-Type"] == "application/pdf"
    assert download["Content-Disposition"] == 'attachment; filename="invoice-GC-2026-000001.pdf"'
    assert download.content.startswith(b"%PDF")


def test_other_tenants_invoice_pages_are_404(client, usage, other_tenant, make_member):
    login(client, make_member(usage, Role.OWNER))
    services.finalize_month(at(2026, 3, 1).date(), now=at(2026, 4, 1, 3))
    theirs = Invoice.objects.filter(tenant=other_tenant).first()
    assert client.get(f"/billing/invoices/{theirs.pk}/").status_code == 404
    assert client.get(f"/billing/invoices/{theirs.pk}/download/csv/").status_code == 404


def test_budget_notices_for_every_page(rf, world, tenant, make_member):
    """The banner is the current budget against the spend so far, whatever alerts fired."""
    from django.template.loader import render_to_string
    from django.utils import timezone

    from billing.context_processors import budget_notices

    request = rf.get("/")
    request.membership = make_member(tenant, Role.VIEWER)
    assert budget_notices(request) == {"budget_notice": None}  # no budget
    world.running(tenant, timezone.now() - timedelta(hours=2))  # 0.90 USD/h
    services.set_budget(tenant, Decimal("10"), "stop")
    assert budget_notices(request) == {"budget_notice": None}  # 18 %
    services.set_budget(tenant, Decimal("1"), "stop")
    notice = budget_notices(request)["budget_notice"]
    assert (notice.level, notice.stopping) == (100, True)
    html = render_to_string("billing/_budget_notices.html", {"notice": notice})
    assert f"has used {notice.percent}% of its monthly budget" in html
    assert "New launches are refused" in html and 'class="error' in html


def _testid(html: str, testid: str) -> str:
    return re.search(rf'data-testid="{testid}">([^<]*)<', html).group(1)


def test_one_money_format_on_every_page_the_cli_and_the_csv(
    client, usage, make_member, token_client, monkeypatch, tmp_path, capsys
):
    """Issue 27, item 8: April so far reads the same on the dashboard, the
    usage page, the draft invoice's page, `gpucloud usage` and the draft's CSV (whose
    amount column keeps a plain number, its currency column the code)."""
    member = make_member(usage, Role.VIEWER)
    login(client, member)
    draft = Invoice.objects.get(tenant=usage, status="draft")
    api = token_client(member)

    def through_the_api(request: httpx.Request) -> httpx.Response:
        answer = api.generic(request.method, request.url.raw_path.decode())
        return httpx.Response(answer.status_code, content=answer.content)

    transport = httpx.MockTransport(through_the_api)
    monkeypatch.setattr(httpx, "Client", functools.partial(httpx.Client, transport=transport))
    monkeypatch.setenv("GPUCLOUD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("GPUCLOUD_URL", "http://testserver")
    monkeypatch.setenv("GPUCLOUD_TOKEN", api.raw_token)
    with time_machine.travel(NOW, tick=False):
        dashboard = client.get("/").content.decode()
        page = client.get("/billing/usage/").content.decode()
        invoice_page = client.get(f"/billing/invoices/{draft.pk}/").content.decode()
        export = client.get(f"/billing/invoices/{draft.pk}/download/csv/").content.decode()
        assert cli_main(["usage"]) == 0
    with time_machine.travel(NOW, tick=False):
        shown = format_money(budgets.month_to_date(usage), "USD")
    assert re.fullmatch(r"[1-9][0-9]*\.[0-9]{2} USD", shown)
    assert _testid(dashboard, "month-to-date") == shown
    assert "$" not in dashboard
    assert _testid(page, "month-to-date") == shown
    assert _testid(invoice_page, "invoice-total") == shown
    assert f"total {shown} · now " in capsys.readouterr().out
    [total] = [row for row in csv.DictReader(io.StringIO(export)) if row["row_type"] == "total"]
    assert format_money(total["amount"], total["currency"]) == shown


def test_per_instance_costs_read_like_their_lines(client, world, tenant, make_member):
    """Issue 27, item 8: a minute at 0.90/h and its disk since: the per-instance row shows
    the sum of its lines at their 6 places (it showed cents, 0.00 for what costs less)."""
    box = world.running(tenant, at(2026, 4, 15, 11), name="blip")
    move(box, S.STOPPING, at(2026, 4, 15, 11, 0, 30))
    login(client, make_member(tenant, Role.VIEWER))
    with time_machine.travel(NOW, tick=False):
        page = client.get("/billing/usage/").content.decode()
    report = usage_report(tenant, NOW.date().replace(day=1), NOW)
    [row] = report.by_instance
    assert row.amount == sum(line.amount for line in report.lines)
    by_instance = page.split('data-testid="by-instance"')[1].split("</table>")[0]
    assert format_money(row.amount, "USD", AS_RATED) in by_instance
    assert format_money(row.amount, "USD") not in by_instance
    lines = page.split('data-testid="usage-lines"')[1].split("</table>")[0]
    for line in report.lines:
        assert format_money(line.amount, "USD", AS_RATED) in lines
