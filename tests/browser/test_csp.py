"""The Content-Security-Policy holds on real pages (issue 12, finding 12): nothing the console
ships is blocked by it, and the selects that submit on change still do, without inline code."""

import pytest
from playwright.sync_api import expect

from accounts.roles import Role
from tests.instances.conftest import Catalog
from tests.instances.helpers import make_instance
from tests.pages import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _violations(page) -> list[str]:
    seen: list[str] = []
    page.on(
        "console",
        lambda message: (
            seen.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    return seen


def test_pages_run_under_the_csp_and_the_state_filter_still_submits(
    page, live_server, tenant, other_tenant, make_member
):
    make_member(tenant, Role.OWNER, username="carol")
    make_member(other_tenant, Role.ADMIN, username="carol")
    violations = _violations(page)
    sign_in(page, live_server.url, "carol")
    response = page.goto(f"{live_server.url}/instances/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    page.select_option("#state-filter", "all")
    page.wait_for_url("**/instances/?state=all")
    expect(page.locator("#state-filter")).to_have_value("all")
    page.select_option("#tenant-select", str(other_tenant.pk))
    expect(page.locator("h1")).to_have_text("Globex")
    instance = make_instance(Catalog(), other_tenant, state="running")
    page.goto(f"{live_server.url}/instances/{instance.pk}/")
    expect(page.locator("[data-chart=gpu_util] svg.main-svg").first).to_be_visible()
    page.goto(f"{live_server.url}/api/v1/docs/")
    expect(page.locator(".swagger-ui .info")).to_be_visible()
    assert violations == []
