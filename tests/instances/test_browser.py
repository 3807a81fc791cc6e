"""The console in headless Chromium against the real stack: log in, launch from the form,
watch the instance turn running without a reload, stop it, terminate it."""

import os
import signal

import pytest
from playwright.sync_api import expect

from tests.instances.e2e import make_catalog, make_tenant, start_agent
from tests.pages import screenshot, sign_in

pytestmark = [pytest.mark.integration, pytest.mark.browser]


def shoot(page, name):
    screenshot(page, f"instances-{name}")


def test_launch_watch_stop_terminate(stack, page):
    make_catalog()
    make_tenant(gpu="1")
    agent, _ = start_agent(stack, "gpu-1", gpus=2, mode="shared,mig")
    base = stack.url

    sign_in(page, base, "mia")
    page.goto(f"{base}/instances/launch/")

    # the form says what fits and what the launch does to the quota, before submitting
    row = page.locator("tr[data-spec=a100-quarter]")
    expect(row.locator("[data-role=fit]")).to_have_text("fits now")
    row.locator("input[type=radio]").check()
    expect(page.locator("[data-role=gpu-after]")).to_have_text("0.25 / 1")
    expect(page.locator("[data-role=inst-after]")).to_have_text("1 / 20")
    expect(page.locator("[data-role=fit-note]")).to_contain_text("fits now")
    page.fill("#id_name", "notebook")
    shoot(page, "launch-desktop")

    os.killpg(agent.pid, signal.SIGSTOP)  # hold provisioning until the page is watching
    try:
        page.click("[data-testid=launch-submit]")
        expect(page.locator("h1 [data-role=state]")).to_have_text("provisioning")
        page.goto(f"{base}/instances/")
        expect(page.locator("[data-live-status]")).to_have_text("● live")
        page.evaluate("window.__noReload = true")
    finally:
        os.killpg(agent.pid, signal.SIGCONT)
    row = page.locator("tr", has_text="notebook")
    expect(row.locator("[data-role=state]")).to_have_text("running", timeout=20_000)
    assert page.evaluate("window.__noReload") is True  # the list changed without a reload
    shoot(page, "list-desktop")

    row.locator("a", has_text="notebook").click()
    expect(page.locator("h1 [data-role=state]")).to_have_text("running")
    page.click("[data-action=stop]")  # it asks first; Cancel leaves it running
    expect(page.locator("h1")).to_contain_text("Stop notebook?")
    expect(page.get_by_test_id("confirm-action")).to_contain_text("ends every process in it")
    shoot(page, "stop-confirm")
    page.get_by_test_id("cancel").click()
    expect(page.locator("h1 [data-role=state]")).to_have_text("running")
    page.click("[data-action=stop]")
    page.click("[data-testid=confirm-stop]")
    page.evaluate("window.__noReload = true")
    expect(page.locator("h1 [data-role=state]")).to_have_text("stopped", timeout=20_000)
    assert page.evaluate("window.__noReload") is True
    expect(page.get_by_test_id("events")).to_contain_text("stopping → stopped")
    shoot(page, "detail-desktop")

    page.click("[data-action=terminate]")
    expect(page.locator("h1")).to_contain_text("Terminate notebook?")
    page.click("[data-testid=confirm-terminate]")
    expect(page.locator("h1 [data-role=state]")).to_have_text("terminated", timeout=20_000)
    expect(page.locator("[data-action]")).to_have_count(0)

    page.set_viewport_size({"width": 390, "height": 844})
    shoot(page, "detail-phone")
    page.goto(f"{base}/instances/?state=all")
    shoot(page, "list-phone")
    page.goto(f"{base}/instances/launch/")
    shoot(page, "launch-phone")
