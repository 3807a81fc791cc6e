"""A budget stop says why (the event, the instance's reason on its page and in the list), and
the budget banner follows the current budget and spend: raised, it is gone for every member;
a member may dismiss it for the level it shows."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect

from accounts.roles import Role
from billing import budgets, services
from console.instances import outcomes
from console.instances import queue as instance_queue
from console.instances.models import Instance, State
from tests.pages import screenshot, sign_in

S = State


@pytest.fixture
def overspent(world, tenant, make_member, monkeypatch):
    """A tenant that chose to stop at a budget of 0.12 USD, with an instance that has run
    for an hour at 0.90 USD/h: the meter's pass stops it (no host to call: the stop is
    recorded done)."""
    monkeypatch.setattr(instance_queue, "enqueue", lambda *args, **kwargs: None)
    make_member(tenant, Role.OWNER, username="olga")
    make_member(tenant, Role.MEMBER, username="max")
    services.set_budget(tenant, Decimal("0.12"), "stop")
    box = world.running(tenant, timezone.now() - timedelta(hours=1), name="trainer")
    services.run_meter()
    assert budgets.enforce(tenant.pk) == 1
    outcomes.finish_stop(box.pk)
    box.refresh_from_db()
    assert box.state == S.STOPPED
    return box


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_a_budget_stop_says_why_and_a_raised_budget_clears_the_banner_for_all(
    page, live_server, overspent
):
    spent = overspent.state_reason.rsplit(" reached at ", 1)[1]
    why = f"Stopped: monthly budget of 0.12 USD reached at {spent}"
    sign_in(page, live_server.url, "max")
    page.goto(f"{live_server.url}/instances/")
    row = page.locator(f'tr[data-instance-id="{overspent.pk}"]')
    expect(row.locator("[data-role=reason]")).to_contain_text(why)
    banner = page.get_by_test_id("budget-notice")
    expect(banner).to_contain_text("of its monthly budget this month")
    expect(banner).to_contain_text("New launches are refused")
    page.goto(f"{live_server.url}/instances/{overspent.pk}/")
    expect(page.get_by_test_id("reason")).to_contain_text(why)
    expect(page.get_by_text(f"{why} — an owner can raise the budget").first).to_be_visible()
    screenshot(page, "budget-stopped-instance")

    page.context.clear_cookies()
    sign_in(page, live_server.url, "olga")
    page.goto(f"{live_server.url}/billing/usage/")
    expect(page.get_by_test_id("budget-notice")).to_be_visible()
    page.fill("#id_budget-monthly_budget", "100")
    page.get_by_test_id("budget-form").get_by_role("button", name="Save budget").click()
    expect(page.get_by_text("Budget saved.")).to_be_visible()
    expect(page.get_by_test_id("budget-notice")).to_have_count(0)

    page.context.clear_cookies()
    sign_in(page, live_server.url, "max")
    page.goto(f"{live_server.url}/instances/")
    expect(page.locator("h1")).to_contain_text("Instances")
    expect(page.get_by_test_id("budget-notice")).to_have_count(0)


@pytest.mark.django_db
def test_a_member_dismisses_the_banner_for_its_level_only(overspent, tenant):
    max_, olga = Client(), Client()
    max_.force_login(tenant.memberships.get(user__username="max").user)
    olga.force_login(tenant.memberships.get(user__username="olga").user)
    assert 'data-testid="budget-notice"' in max_.get("/instances/").content.decode()
    back = max_.post(
        "/billing/budget-notice/dismiss/", {"level": "100", "next": "/instances/?state=all"}
    )
    assert (back.status_code, back["Location"]) == (302, "/instances/?state=all")
    assert 'data-testid="budget-notice"' not in max_.get("/instances/").content.decode()
    assert 'data-testid="budget-notice"' in olga.get("/instances/").content.decode()  # hers
    # another budget is another level: shown again (at 50 % of 1.50 USD, a warning)
    services.set_budget(tenant, Decimal("1.50"), "stop")
    page = max_.get("/instances/").content.decode()
    assert 'data-testid="budget-notice"' in page and 'class="warning' in page
    # a stale level, a foreign next: nothing dismissed, back home
    back = max_.post("/billing/budget-notice/dismiss/", {"level": "100", "next": "https://x.io/"})
    assert (back.status_code, back["Location"]) == (302, "/")
    assert 'data-testid="budget-notice"' in max_.get("/instances/").content.decode()
    assert max_.get("/billing/budget-notice/dismiss/").status_code == 405
    assert Instance.objects.get(pk=overspent.pk).state == S.STOPPED
