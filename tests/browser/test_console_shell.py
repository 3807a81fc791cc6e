import pytest
from playwright.sync_api import expect

from accounts.models import ApiToken
from accounts.roles import Role
from tests.pages import screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_log_in_switch_tenant_create_token(page, live_server, tenant, other_tenant, make_member):
    make_member(tenant, Role.OWNER, username="carol")
    make_member(other_tenant, Role.ADMIN, username="carol")
    sign_in(page, live_server.url, "carol")
    expect(page.locator("h1")).to_have_text("Acme AI")

    page.select_option("#tenant-select", str(other_tenant.pk))
    expect(page.locator("h1")).to_have_text("Globex")
    expect(page.locator(".messages")).to_contain_text("Now working in Globex")

    page.click("text=API tokens")
    page.fill("input[name=name]", "notebook")
    page.click("text=Create token")
    secret = page.locator("#new-token-value").inner_text().strip()
    token = ApiToken.objects.get(name="notebook")
    assert token.tenant == other_tenant
    assert secret.startswith(f"gpc_{token.prefix}_")
    expect(page.get_by_test_id("token-list")).to_contain_text("notebook")

    page.goto(f"{live_server.url}/tokens/")  # the secret is shown once
    expect(page.locator("#new-token-value")).to_have_count(0)
    expect(page.get_by_test_id("token-list")).to_contain_text(f"gpc_{token.prefix}_")
    screenshot(page, "tokens-desktop")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{live_server.url}/")
    screenshot(page, "dashboard-phone")


def test_viewer_sees_refusal_message(page, live_server, tenant, make_member):
    make_member(tenant, Role.VIEWER, username="vic")
    sign_in(page, live_server.url, "vic")
    page.goto(f"{live_server.url}/members/")
    expect(page.locator("text=Invite a member")).to_have_count(0)
    page.goto(f"{live_server.url}/tokens/")
    expect(page.get_by_test_id("read-only-explained")).to_contain_text("read-only")
    page.fill("input[name=name]", "dashboards")
    page.click("text=Create read-only token")
    expect(page.get_by_test_id("token-list")).to_contain_text("read only")
    screenshot(page, "tokens-viewer")


def test_a_long_tenant_name_is_shown_whole_in_the_switcher(
    page, live_server, tenant, other_tenant, make_member
):
    long_name = "Northwestern Institute for Computational Linguistics and Speech Research"
    tenant.name = long_name
    tenant.save(update_fields=["name"])
    make_member(tenant, Role.OWNER, username="nora")
    make_member(other_tenant, Role.MEMBER, username="nora")
    sign_in(page, live_server.url, "nora")
    page.select_option("#tenant-select", str(tenant.pk))
    current = page.get_by_test_id("current-tenant")
    expect(current).to_contain_text(long_name)
    sidebar = page.locator(".sidebar").bounding_box()
    box = current.bounding_box()
    assert box["x"] + box["width"] <= sidebar["x"] + sidebar["width"]  # wrapped, not cut
    expect(page.locator("#tenant-select")).to_have_attribute("title", long_name)
    expect(page.locator(f'#tenant-select option[title="{long_name} (owner)"]')).to_have_count(1)
    screenshot(page, "tenant-switcher-long-name")


def test_error_pages_keep_the_console_and_a_way_back(page, live_server, tenant, make_member):
    make_member(tenant, Role.MEMBER, username="mia")
    sign_in(page, live_server.url, "mia")
    page.goto(f"{live_server.url}/instances/999999/")
    expect(page.get_by_test_id("error-page")).to_contain_text("Page not found")
    expect(page.locator(".sidebar")).to_be_visible()
    screenshot(page, "error-404")
    page.get_by_test_id("error-home").click()
    expect(page.locator("h1")).to_have_text("Acme AI")
