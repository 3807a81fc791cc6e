"""The launch form and the resize in headless Chromium, on hosts made in the database: what
each spec does in each region, errors where the eye is, and a resize that asks before it
stops anything."""

from decimal import Decimal

import pytest
from playwright.sync_api import expect

from accounts.models import Quota
from accounts.roles import Role
from console.catalog.models import Mode
from console.fleet.models import Host
from console.instances import outcomes, services
from console.instances.models import Instance, State
from tests.pages import screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def mia(tenant, make_member):
    return make_member(tenant, Role.MEMBER, username="mia")


def fit(page, code):
    return page.locator(f"tr[data-spec={code}] [data-role=fit]")


def test_each_spec_says_whether_it_fits_queues_or_cannot_launch(
    page, live_server, catalog, tenant, mia
):
    Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal("1"))
    catalog.host(gpus=1, mode=Mode.SHARED)
    catalog.host(gpus=2, mode=Mode.WHOLE, status=Host.Status.CORDONED)  # there, but busy
    sign_in(page, live_server.url, "mia")
    page.goto(f"{live_server.url}/instances/launch/")

    expect(fit(page, "a100-quarter")).to_have_text("fits now")
    expect(fit(page, "a100-1x")).to_have_text("queues")
    expect(fit(page, "a100-1g10gb")).to_have_text("no hardware here")  # no MIG host
    expect(fit(page, "a100-2x")).to_have_text("over your quota")  # 2 GPUs, quota 1
    screenshot(page, "instances-launch-availability")

    page.locator("tr[data-spec=a100-1x] input").check()
    expect(page.locator("[data-role=fit-note]")).to_have_text(
        "queues It waits in the queue until a slice frees."
    )
    page.get_by_test_id("spec-fold-summary").click()  # what cannot run here is folded
    page.locator("tr[data-spec=a100-1g10gb] input").check()
    expect(page.locator("[data-role=fit-note]")).to_contain_text("cannot launch No host in")

    page.select_option("#id_region", "local-2")  # no host at all there
    expect(fit(page, "a100-quarter")).to_have_text("no hardware here")

    # launching one that cannot run anyway: refused, with the reason at the top
    page.select_option("#id_region", "local-1")
    page.locator("tr[data-spec=a100-2x] input").check()
    page.fill("#id_name", "big")
    page.click("[data-testid=launch-submit]")
    expect(page.get_by_test_id("error-summary")).to_contain_text(
        "Spec: A100 x2 cannot be launched: A100 x2 needs 2 GPU; your quota is 1 GPU."
    )
    assert not Instance.objects.exists()


def test_errors_are_at_the_top_linked_and_focused(page, live_server, catalog, tenant, mia):
    catalog.host(gpus=1, mode=Mode.SHARED)
    sign_in(page, live_server.url, "mia")
    page.goto(f"{live_server.url}/instances/launch/")
    page.locator("tr[data-spec=a100-quarter] input").check()
    expect(page.locator("[data-role=fit-note]")).to_contain_text("fits now")
    page.fill("#id_name", "x" * 10_000)  # no maxlength: the page does not cut it
    page.fill("#id_env", "no equals sign")
    page.click("[data-testid=launch-submit]")

    summary = page.get_by_test_id("error-summary")
    expect(summary).to_be_in_viewport()
    links = summary.locator("[data-error-link]")
    expect(links).to_have_count(2)
    expect(links.nth(0)).to_have_text(
        "Name: Ensure this value has at most 63 characters (it has 10000)."
    )
    expect(links.nth(1)).to_have_text("Environment: Line 1: write NAME=value.")
    expect(links.nth(0)).to_be_focused()
    # the sidebar does not promise a launch over a form that was refused
    note = page.locator("[data-role=fit-note]")
    expect(note).not_to_contain_text("fits now")
    expect(note).to_contain_text("Fix the problems at the top of the form first.")
    screenshot(page, "instances-launch-errors")

    links.nth(1).click()
    expect(page.locator("#id_env")).to_be_in_viewport()
    assert not Instance.objects.exists()


def test_resize_offers_what_can_run_and_asks_before_stopping(
    page, live_server, catalog, tenant, mia
):
    Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal("8"), max_instances=50)
    catalog.host("home", gpus=2, mode=Mode.SHARED)
    catalog.host("elsewhere", gpus=2, mode=Mode.WHOLE)  # its disk cannot move there
    instance = services.launch_instance(
        tenant, name="nb", spec=catalog.quarter, image=catalog.image
    )
    outcomes.mark_running(instance.pk, instance.current_allocation().pk)
    sign_in(page, live_server.url, "mia")
    page.goto(f"{live_server.url}/instances/{instance.pk}/")

    options = page.locator("#id_resize_spec option")
    expect(options).to_have_text(["A100 1/2 — 1.80 USD/h · restarts it"])  # another fraction
    expect(page.locator("#id_resize_disk")).to_have_value("50")

    for name, spec in (("f1", catalog.half), ("f2", catalog.quarter)):  # its GPU is full now
        services.launch_instance(tenant, name=name, spec=spec, image=catalog.image)
    page.reload()
    expect(options).to_have_text(["A100 1/2 — 1.80 USD/h · stops it"])
    screenshot(page, "instances-resize-offers")
    page.fill("#id_resize_disk", "80")
    page.click("[data-action=resize]")

    expect(page.locator("h1")).to_have_text("Stop nb to resize it?")
    expect(page.get_by_test_id("resize-confirm")).to_contain_text("(50 → 80 GiB)")
    screenshot(page, "instances-resize-confirm")
    instance.refresh_from_db()
    assert instance.state == State.RUNNING  # nothing stopped while it asks

    page.click("[data-testid=confirm-resize]")
    expect(page.locator("h1 [data-role=state]")).to_have_text("stopping")
    instance.refresh_from_db()
    assert (instance.spec, instance.disk_gib) == (catalog.half, 80)
    expect(page.get_by_test_id("disk")).to_contain_text("80 GiB")
