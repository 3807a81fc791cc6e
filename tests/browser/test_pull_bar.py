"""An image pull's bar on the instance page, in headless Chromium against the real stack: the
page open, the agent's progress events (sent as its host, with their figures) redraw the bar
live, with no reload, and it goes once the pull is over."""

import os
import signal

import httpx
import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.fleet.models import Host
from console.instances.models import Instance
from tests.instances.e2e import make_catalog, make_tenant, start_agent, wait_for
from tests.pages import screenshot, sign_in

pytestmark = [pytest.mark.integration, pytest.mark.browser]
REF = "registry.example/team/pytorch:2.4"
SECRET = "the-hosts-secret-for-this-test"


def report(stack, host, instance, message, **figures):
    event = {"allocation": instance.current_allocation().pk, "instance": instance.pk,
             "kind": "progress", "at": timezone.now().isoformat(), "message": message}  # fmt: skip
    if figures:
        event["pull"] = {"reference": REF, **figures}
    answer = httpx.post(
        f"{stack.url}/agent/v1/events",
        json={"host_id": host.pk, "events": [event]},
        headers={"Authorization": f"Bearer {SECRET}"},
    )
    assert answer.status_code == 202, answer.text


def test_the_instance_page_draws_the_pulls_bar_live(stack, page):
    make_catalog()
    make_tenant(gpu="1")
    agent, host = start_agent(stack, "gpu-1", gpus=2, mode="shared,mig")
    os.killpg(agent.pid, signal.SIGSTOP)  # the launch stays provisioning: we speak for it
    try:
        host = Host.objects.get(pk=host.pk)
        host.set_secret(SECRET)
        host.save()
        sign_in(page, stack.url, "mia")
        page.goto(f"{stack.url}/instances/launch/")
        page.locator("tr[data-spec=a100-quarter] input[type=radio]").check()
        page.fill("#id_name", "cold")
        page.click("[data-testid=launch-submit]")
        expect(page.locator("h1 [data-role=state]")).to_have_text("provisioning")
        instance = wait_for(
            lambda: Instance.objects.filter(name="cold", allocations__isnull=False).first(),
            what="its allocation",
            stack=stack,
        )
        expect(page.locator("[data-live-status]")).to_have_text("● live")
        page.evaluate("window.__noReload = true")

        bar = page.get_by_test_id("pull-progress")
        report(stack, host, instance, f"pulling {REF}: 1 of 4 layers · 850.0 MB of 3.4 GB",
               layers_done=1, layers_total=4, bytes_done=850_000_000,
               bytes_total=3_400_000_000, eta_seconds=90)  # fmt: skip
        expect(bar).to_have_attribute("data-percent", "25")
        expect(page.get_by_test_id("pull-summary")).to_have_text(
            "1 of 4 layers · 850.0 MB of 3.4 GB · about 2 min left"
        )
        report(stack, host, instance, f"pulling {REF}: 3 of 4 layers · 2.6 GB of 3.4 GB",
               layers_done=3, layers_total=4, bytes_done=2_550_000_000,
               bytes_total=3_400_000_000, eta_seconds=12)  # fmt: skip
        expect(bar).to_have_attribute("data-percent", "75")
        expect(page.get_by_test_id("pull-summary")).to_contain_text("about 12 s left")
        screenshot(page, "instances-pull-bar")
        report(stack, host, instance, "the container starts")  # no figures: the bar goes
        expect(bar).to_have_count(0)
        expect(page.get_by_test_id("reason")).to_have_text("the container starts")
        assert page.evaluate("window.__noReload") is True
    finally:
        os.killpg(agent.pid, signal.SIGCONT)
