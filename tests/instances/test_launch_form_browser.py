"""The launch form in headless Chromium, on hosts made in the database: what can run comes
first with how many fit now, the rest is folded; a launch without a name gets a generated
one, with the disk and the web ports asked for."""

import re

import pytest
from playwright.sync_api import expect

from accounts.roles import Role
from console.catalog.models import Mode
from console.fleet.models import Host
from console.instances.models import Instance
from tests.pages import screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def mia(tenant, make_member):
    return make_member(tenant, Role.MEMBER, username="mia")


def row(page, code):
    return page.locator(f"tr[data-spec={code}]")


def test_what_can_run_comes_first_with_how_many_fit_and_the_rest_is_folded(
    page, live_server, catalog, tenant, mia
):
    catalog.host(gpus=1, mode=Mode.SHARED)  # one free GPU: four quarters or two halves
    catalog.host(gpus=1, mode=Mode.WHOLE, status=Host.Status.CORDONED)  # there, but busy
    sign_in(page, live_server.url, "mia")
    page.goto(f"{live_server.url}/instances/launch/")

    runnable = page.locator("[data-spec-table=runnable]")
    fold = page.locator("[data-spec-fold]")
    expect(page.locator("[data-role=spec-counts]")).to_have_text("3 can run here")
    expect(runnable.locator("tr[data-spec]")).to_have_count(3)
    expect(row(page, "a100-quarter").locator("[data-role=count]")).to_have_text("4 free")
    expect(row(page, "a100-half").locator("[data-role=count]")).to_have_text("2 free")
    expect(row(page, "a100-1x").locator("[data-role=count]")).to_have_text("0 free")  # queues
    expect(runnable.locator("tr[data-group-row]").first).to_have_text(
        "NVIDIA A100 80GB · Shared fraction"
    )
    # no MIG host, no second whole GPU: folded, closed, counted
    expect(page.get_by_test_id("spec-fold-summary")).to_contain_text("3 more that cannot run here")
    assert fold.get_attribute("open") is None
    expect(row(page, "a100-1g10gb")).to_be_hidden()
    expect(row(page, "a100-2x").locator("[data-role=count]")).to_have_text("")
    page.get_by_test_id("spec-fold-summary").click()
    expect(row(page, "a100-1g10gb").locator("[data-role=fit]")).to_have_text("no hardware here")
    page.get_by_test_id("spec-fold-summary").click()
    screenshot(page, "instances-launch-folded")
    expect(page.locator("[data-role=none-runnable]")).to_be_hidden()

    page.select_option("#id_region", "local-2")  # no host at all there: everything folded
    expect(page.locator("[data-role=spec-counts]")).to_have_text("0 can run here")
    expect(runnable).to_be_hidden()
    expect(page.locator("[data-role=none-runnable]")).to_be_visible()
    expect(page.get_by_test_id("spec-fold-summary")).to_contain_text("6 more that cannot run")

    page.select_option("#id_region", "local-1")
    expect(runnable.locator("tr[data-spec]")).to_have_count(3)
    row(page, "a100-quarter").locator("input").check()
    expect(page.locator("[data-role=spec-disk]")).to_have_text("This spec comes with 50 GiB.")
    page.fill("#id_disk_gib", "80")
    page.fill("#id_ports", "8080:app")
    page.click("[data-testid=launch-submit]")  # no name: it gets one
    expect(page.locator("h1 [data-role=state]")).to_be_visible()
    instance = Instance.objects.get()
    assert re.fullmatch(r"a100-quarter-[a-z]+-[a-z]+", instance.name), instance.name
    assert (instance.disk_gib, instance.ports) == (80, [{"port": 8080, "name": "app"}])
    expect(page.locator("h1")).to_contain_text(instance.name)
    expect(page.get_by_test_id("disk")).to_contain_text("80 GiB at /workspace")
    expect(page.get_by_test_id("access")).to_contain_text("app")


def test_a_smaller_disk_or_a_bad_port_line_is_a_field_error(
    page, live_server, catalog, tenant, mia
):
    catalog.host(gpus=1, mode=Mode.SHARED)
    sign_in(page, live_server.url, "mia")
    page.goto(f"{live_server.url}/instances/launch/")
    row(page, "a100-quarter").locator("input").check()
    page.fill("#id_disk_gib", "10")
    page.fill("#id_ports", "8080 app")
    page.click("[data-testid=launch-submit]")
    summary = page.get_by_test_id("error-summary")
    expect(summary).to_contain_text("Disk (GiB): A100 1/4 comes with 50 GiB: give at least that.")
    expect(summary).to_contain_text("Web ports: Line 1: write PORT:NAME, e.g. 8080:app.")
    assert not Instance.objects.exists()
