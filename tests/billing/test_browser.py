"""The usage page in a real browser (headless Chromium), and an invoice download."""

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from accounts.roles import Role
from billing import services
from billing.models import Invoice
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
    move(train, State.STOPPING, last_month + timedelta(days=3, hours=7, seconds=12))
    world.running(tenant, max(this_month, now - timedelta(hours=5)), spec=world.whole, name="infer")
    services.run_meter(now)
    services.finalize_month(last_month.date(), now=now)
    invoice = Invoice.objects.get(tenant=tenant, month=last_month.date())
    make_member(tenant, Role.OWNER, username="olga")

    sign_in(page, live_server.url, "olga")
    page.click("text=Usage")
    expect(page.locator("h1")).to_contain_text("Usage")
    expect(page.get_by_test_id("month-to-date")).not_to_have_text("0.00")
    expect(page.get_by_test_id("rate")).to_have_text("3.20")
    expect(page.locator("#usage-chart[data-rendered=true] .main-svg").first).to_be_visible()
    expect(page.get_by_test_id("by-instance")).to_contain_text("infer")
    expect(page.get_by_test_id("budget-form")).to_be_visible()
    screenshot(page, "billing-usage")

    page.get_by_test_id("previous-month").click()
    expect(page.get_by_test_id("month-invoice")).to_contain_text(invoice.number)
    page.get_by_test_id("month-invoice").click()
    expect(page.get_by_test_id("invoice-total")).to_have_text(f"{invoice.total:,.2f}")
    with page.expect_download() as download_info:
        page.get_by_test_id("download-pdf").click()
    download = download_info.value
    assert download.suggested_filename == f"invoice-{invoice.number}.pdf"
    saved = tmp_path / download.suggested_filename
    download.save_as(saved)
    assert saved.read_bytes().startswith(b"%PDF")
    screenshot(page, "billing-invoice")
