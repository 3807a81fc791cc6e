"""The instance page's charts and terminal follow the instance's state, in headless Chromium on
the real ASGI server: a queued instance's empty charts say so over the last minutes, a
terminated one is not live and opens no socket, a stopped period is a gap, and the terminal is
there only while the instance runs."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from accounts.roles import Role
from console.instances.models import Instance, State
from console.metrics.ingest import instance_series
from console.metrics.models import MetricMinute
from tests.factories import ImageFactory, RegionFactory, SpecFactory
from tests.pages import screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def make_instance(tenant, name: str, state: str) -> Instance:
    return Instance.objects.create(
        tenant=tenant, name=name, spec=SpecFactory(), image=ImageFactory(),
        region=RegionFactory(), state=state,
        terminated_at=timezone.now() if state == State.TERMINATED else None,
    )  # fmt: skip


def record(instance: Instance, minute: datetime, util: float) -> None:
    """A minute of history, as the downsampling task writes it."""
    values = {}
    for metric, value in {"gpu_util": util, "mem_used_mib": 2048.0, "temperature_c": 55.0,
                          "power_w": 180.0}.items():  # fmt: skip
        values.update({f"{metric}_min": value, f"{metric}_mean": value, f"{metric}_max": value})
    MetricMinute.objects.create(
        series=instance_series(instance.pk), minute=minute, instance=instance, samples=60,
        mem_total_mib=81920.0, **values,
    )  # fmt: skip


def sockets_of(page) -> list[str]:
    opened: list[str] = []
    page.on("websocket", lambda socket: opened.append(socket.url))
    return opened


def test_a_queued_instance_has_empty_charts_over_the_last_minutes_and_no_terminal(
    stack, page, tenant, make_member
):
    queued = make_instance(tenant, "queued", State.PENDING)
    make_member(tenant, Role.MEMBER, username="wes")
    sign_in(page, stack.url, "wes")
    page.goto(f"{stack.url}/instances/{queued.pk}/")

    charts = page.get_by_test_id("instance-metrics")
    expect(charts.locator("[data-metrics-status]")).to_have_text("live")
    util = page.get_by_test_id("chart-gpu_util")
    expect(util).to_have_attribute("data-empty", "true")
    expect(util.locator(".annotation-text")).to_have_text("no data yet")
    shown = page.evaluate(
        "() => document.querySelector('[data-chart=gpu_util]').layout.xaxis.range"
        ".map((d) => (typeof d === 'string' ? Date.parse(d.replace(' ', 'T') + 'Z') : +d) / 1000)"
    )
    now = datetime.now(UTC).timestamp()
    assert abs(shown[1] - now) < 120 and abs(shown[1] - shown[0] - 600) < 5, shown
    assert not any("2000" in t for t in util.locator(".xtick text").all_text_contents())
    expect(page.locator("[data-terminal]")).to_be_hidden()

    # placed and running (the page then asks the server for the rest, which must agree)
    Instance.objects.filter(pk=queued.pk).update(state=State.RUNNING)
    page.evaluate(f"() => window.gpucloudLive.apply({{id: {queued.pk}, state: 'running'}})")
    expect(page.locator("[data-terminal]")).to_be_visible()  # a shell
    screenshot(page, "instance-queued")


def test_a_terminated_instance_is_not_live_and_shows_its_history_with_gaps(
    stack, page, tenant, make_member
):
    ended = make_instance(tenant, "ended", State.TERMINATED)
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=50)
    for offset in [0, 1, 2, 3, 20, 21, 22]:  # stopped for 16 minutes in between
        record(ended, start + timedelta(minutes=offset), util=70.0)
    make_member(tenant, Role.MEMBER, username="wes")
    sign_in(page, stack.url, "wes")
    opened = sockets_of(page)
    page.goto(f"{stack.url}/instances/{ended.pk}/")

    expect(page.locator("[data-live-status]")).to_have_text("○ ended · not live")
    charts = page.get_by_test_id("instance-metrics")
    expect(charts.locator("[data-metrics-status]")).to_have_text("ended · not live")
    expect(page.get_by_test_id("chart-gpu_util")).to_have_attribute("data-empty", "true")
    assert page.locator("[data-terminal]").count() == 0

    page.click("[data-range='1h']")
    util = page.get_by_test_id("chart-gpu_util")
    expect(util).to_have_attribute("data-empty", "false")
    line = page.evaluate("() => document.querySelector('[data-chart=gpu_util]').data[0].y")
    assert line == [70.0] * 4 + [None] + [70.0] * 3  # the stopped minutes: a gap, not a line
    page.wait_for_timeout(500)
    assert opened == [], opened  # nothing more will happen to it: no socket at all
    screenshot(page, "instance-terminated")
