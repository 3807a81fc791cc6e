"""The first launch from the form, end to end in headless Chromium on a real container host:
the instance page, opened while it provisions, shows the Terminal once it runs (even when it
ran before the page listened for changes) and its shell answers, all without a reload."""

import os
import re
import signal

import pytest
from playwright.sync_api import expect

from agent.devtools.engine import DEMO_IMAGE
from tests.factories import ImageFactory
from tests.instances.e2e import api_client, make_catalog, make_tenant, start_agent, wait_for
from tests.pages import screenshot, sign_in

pytestmark = [pytest.mark.integration, pytest.mark.containers, pytest.mark.browser]


def test_launch_from_the_form_then_use_the_terminal_without_a_reload(stack, container_engine, page):
    make_catalog()
    # first by name: the form's default image (a local one: no registry here)
    ImageFactory(name="demo-busybox", reference=DEMO_IMAGE, command=[], cuda_version="")
    _, membership = make_tenant()
    api = api_client(stack, membership)
    agent, _ = start_agent(stack, "gpu-1", gpus=2, runtime="oci", engine_url=container_engine.url)
    sign_in(page, stack.url, "mia")
    page.goto(f"{stack.url}/instances/launch/")
    page.locator("tr[data-spec=a100-quarter] input").check()

    def states() -> list[str]:
        return [i["state"] for i in api.get("/instances/").json()["results"]]

    seen_by_the_page = []

    def once_it_runs(route):
        """The page's live script loads only after the instance runs: the page was served
        while it provisioned, and its events socket opens after the change to running."""
        seen_by_the_page.extend(states())
        os.killpg(agent.pid, signal.SIGCONT)
        wait_for(lambda: states() == ["running"], timeout=60, what="the instance running")
        route.continue_()

    page.route("**/static/js/instances.js", once_it_runs)
    os.killpg(agent.pid, signal.SIGSTOP)  # provisioning waits for the agent meanwhile
    try:
        page.click("[data-testid=launch-submit]")  # no name: a generated one
        expect(page.locator("h1")).to_contain_text(re.compile(r"a100-quarter-[a-z]+-[a-z]+"))
    finally:
        os.killpg(agent.pid, signal.SIGCONT)
    page.evaluate("window.__noReload = true")

    terminal = page.locator("[data-terminal]")
    expect(page.locator("h1 [data-role=state]")).to_have_text("running", timeout=20_000)
    expect(terminal).to_be_visible()
    assert seen_by_the_page == ["provisioning"]
    page.get_by_test_id("terminal-connect").click()
    expect(terminal.locator("[data-terminal-status]")).to_have_text("· connected")
    page.keyboard.type("echo $((6*7))")
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("terminal")).to_contain_text("42", timeout=10_000)
    assert page.evaluate("window.__noReload") is True
    screenshot(page, "instances-first-launch-terminal")
