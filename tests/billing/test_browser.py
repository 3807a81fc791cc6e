"""The usage page in a real browser (headless Chromium), and an invoice download."""

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from accounts.roles import Role
from billing import services
from billing.models import Invoice
from billing.money import format_money
from billing.rating import month_start
from console.instances.models import State
from tests.billing.conftest import move
from tests.pages import screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_usage_page_and_invoice_download(page, live_server, world, tenant, make_member, tmp_path):
    now = timezone.now()
    this_month = month_start(now)
    last_month = month_start(this_month - timedelta(days=1))
    train = world.running(tenant, last_month + timedelta(days=3), name="train")
    move(train, State.TERMINATING, last_month + timedelta(days=3, hours=7, seconds=12))
    world.running(tenant, max(this_month, now - timedelta(hours=5)), spec=world.whole, name="infer")
    services.run_meter(now)
    services.finalize_month(last_month.date(), now=now)
    invoice = Invoice.objects.get(tenant=tenant, month=last_month.date())
    make_member(tenant, Role.OWNER, username="olga")

    sign_in(page, live_server.url, "olga")
    page.click("text=Usage")
    expect(page.locator("h1")).to_contain_text("Usage")
    expect(page.get_by_test_id("month-to-date")).not_to_have_text("0.00 USD")
    expect(page.get_by_test_id("rate")).to_have_text("3.200000 USD")
    expect(page.locator("#usage-chart[data-rendered=true] .main-svg").first).to_be_visible()
    expect(page.get_by_test_id("by-instance")).to_contain_text("infer")
    expect(page.get_by_test_id("budget-form")).to_be_visible()
    screenshot(page, "billing-usage")

    page.get_by_test_id("previous-month").click()
    expect(page.get_by_test_id("month-invoice")).to_contain_text(invoice.number)
    page.get_by_test_id("month-invoice").click()
    expect(page.get_by_test_id("invoice-total")).to_have_text(format_money(invoice.total, "USD"))
    with page.expect_download() as download_info:
        page.get_by_test_id("download-pdf").click()
    download = download_info.value
    assert download.suggested_filename == f"invoice-{invoice.number}.pdf"
    saved = tmp_path / download.suggested_filename
    download.save_as(saved)
    assert saved.read_bytes().startswith(b"%PDF")
    screenshot(page, "billing-invoice")


LONG_NAME = "llama-3-70b-finetune-with-a-very-long-experiment-name-run-00042"  # 63: the most


def _inside_the_viewport(page, locator) -> None:
    """Every element of ``locator`` lies inside the viewport's width and inside its table's
    scroll area: seen without scrolling sideways."""
    width = page.viewport_size["width"]
    assert locator.count(), "nothing to check"
    for index in range(locator.count()):
        cell = locator.nth(index)
        expect(cell).to_be_visible()
        box = cell.bounding_box()
        clip = cell.evaluate_handle("el => el.closest('.table-wrap, .card')").bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= width, (cell.inner_text(), box)
        assert box["x"] + box["width"] <= clip["x"] + clip["width"] + 0.5, (cell.inner_text(), box)


@pytest.mark.parametrize("width", [1280, 1024])
def test_a_long_instance_name_never_hides_the_money(
    page, live_server, world, tenant, make_member, width
):
    assert len(LONG_NAME) == 63
    started = max(month_start(timezone.now()), timezone.now() - timedelta(hours=2))
    world.running(tenant, started, spec=world.whole, name=LONG_NAME)
    services.run_meter(timezone.now())
    draft = Invoice.objects.get(tenant=tenant, month=month_start(timezone.now()).date())
    make_member(tenant, Role.VIEWER, username="vera")
    page.set_viewport_size({"width": width, "height": 860})
    sign_in(page, live_server.url, "vera")

    page.goto(f"{live_server.url}/billing/usage/")
    lines = page.get_by_test_id("usage-lines")
    _inside_the_viewport(page, lines.locator("th.num"))
    _inside_the_viewport(page, lines.locator("td.num"))
    _inside_the_viewport(page, page.get_by_test_id("by-instance").locator("td.num"))
    _inside_the_viewport(page, page.get_by_test_id("accruing").locator("td.num"))
    name = page.get_by_test_id("by-instance").locator(f'[title="{LONG_NAME}"]')
    expect(name).to_be_visible()
    assert name.evaluate("el => el.scrollWidth > el.clientWidth")  # cut, with its tooltip
    screenshot(page, f"billing-usage-long-name-{width}")

    page.goto(f"{live_server.url}/billing/invoices/{draft.pk}/")
    table = page.get_by_test_id("invoice-lines")
    _inside_the_viewport(page, table.locator("th.num"))
    _inside_the_viewport(page, table.locator("td.num"))  # amounts, subtotal … total
    expect(table.locator(f'[title="{LONG_NAME}"]')).to_be_visible()
    expect(page.get_by_test_id("invoice-total")).not_to_have_text("0.00 USD")
    screenshot(page, f"billing-invoice-long-name-{width}")
