"""The usage page's daily spend chart in headless Chromium on the first day of a month: one bar
of one day, each day labelled once, and a visible month-to-date point."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from playwright.sync_api import expect

from accounts.roles import Role
from billing import services
from tests.pages import screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FIRST = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def test_the_first_day_of_the_month_is_one_bar_and_one_point(
    page, live_server, world, tenant, make_member
):
    with time_machine.travel(FIRST, tick=True):
        world.running(tenant, FIRST - timedelta(hours=3), spec=world.whole, name="infer")
        services.run_meter(FIRST)
        make_member(tenant, Role.OWNER, username="olga")
        sign_in(page, live_server.url, "olga")
        page.goto(f"{live_server.url}/billing/usage/")
        chart = page.locator("#usage-chart[data-rendered=true]")
        expect(chart.locator(".main-svg").first).to_be_visible()

        labels = chart.locator(".xtick text").all_text_contents()
        assert labels[:3] == ["1", "2", "3"] and len(labels) == len(set(labels)) == 31
        assert chart.locator(".g-xtitle").text_content() == "December 2026"
        bars = chart.locator(".barlayer .point path")
        assert bars.count() == 1
        plot_width = chart.locator(".nsewdrag").first.bounding_box()["width"]
        assert bars.first.bounding_box()["width"] < plot_width / 31  # one day, not two
        point = chart.locator(".scatterlayer .point")
        expect(point).to_have_count(1)  # the month to date: a marker, not an invisible line
        assert point.bounding_box()["width"] > 4
        screenshot(page, "billing-usage-first-of-month")
