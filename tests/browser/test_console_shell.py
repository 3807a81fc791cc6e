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
    expect(page.locator("text=New token")).to_have_count(0)
