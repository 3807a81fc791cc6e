"""The operator's pages in Chromium at 1280 px: the fleet page's holders and queue, and the
admin's image form with its rows of ports and environment."""

import pytest
from playwright.sync_api import expect

from console.catalog.models import Image, Mode
from console.instances.models import Allocation, GpuClaim, Instance
from tests.factories import ImageFactory, SpecFactory, TenantFactory, UserFactory
from tests.pages import screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_fleet_page_links_holders_and_the_queue(page, live_server, register, region):
    UserFactory(username="ops", is_staff=True, is_superuser=True)
    host, _ = register("host-a", gpus=2, mode="shared")
    acme = TenantFactory(slug="acme", name="Acme AI")
    spec = SpecFactory(code="a100-quarter", name="A100 · 1/4", gpu_model=host.gpus.first().model)
    image = ImageFactory()
    for n, milli in enumerate((250, 500)):
        instance = Instance.objects.create(
            tenant=acme, name=f"trainer-{n}", spec=spec, image=image, region=region,
            state="running",
        )  # fmt: skip
        allocation = Allocation.objects.create(
            id=f"alloc-{n}", instance=instance, host=host, mode=Mode.SHARED
        )
        GpuClaim.objects.create(allocation=allocation, gpu=host.gpus.get(index=0), milli=milli)
    Instance.objects.create(
        tenant=acme, name="big-job", spec=spec, image=image, region=region,
        state_reason_detail="Waiting for capacity: no A100 · 1/4 free in Local 1.",
    )  # fmt: skip

    sign_in(page, live_server.url, "ops")
    page.goto(f"{live_server.url}/fleet/")
    holders = page.get_by_test_id("holders-host-a-gpu0")
    expect(holders).to_contain_text("Acme AI · trainer-0 250 milli · running")
    expect(holders).to_contain_text("trainer-1 500 milli")
    expect(page.get_by_test_id("waiting")).to_contain_text("big-job")
    screenshot(page, "fleet-holders")
    holders.get_by_role("link", name="trainer-1").click()
    trainer = Instance.objects.get(name="trainer-1")
    expect(page).to_have_url(f"{live_server.url}/admin/instances/instance/{trainer.pk}/change/")
    expect(page.locator("#content")).to_contain_text("trainer-1 (running)")


def test_admin_image_form_rows_and_errors(page, live_server):
    UserFactory(username="ops", is_staff=True, is_superuser=True)
    sign_in(page, live_server.url, "ops")
    page.goto(f"{live_server.url}/admin/catalog/image/add/")
    page.fill("#id_name", "trainer")
    page.fill("#id_reference", "registry.local:5000/team/train:v1")
    page.fill("[aria-label='Port in row 1']", "8888")
    page.fill("input[name='ports-0-name']", "JupyterLab")
    page.select_option("[aria-label='App in row 1']", "jupyter")
    page.fill("[aria-label='Port in row 2']", "8888")
    page.fill("input[name='ports-1-name']", "Again")
    page.fill("input[name='env-0-name']", "NVIDIA_VISIBLE_DEVICES")
    page.fill("input[name='env-0-value']", "all")
    page.click("input[name=_continue]")
    errors = page.locator(".field-ports .errorlist")
    expect(errors).to_contain_text("Row 2: port 8888 is already in row 1.")
    expect(page.locator(".field-env .errorlist")).to_contain_text("Row 1: NVIDIA_VISIBLE_DEVICES")
    screenshot(page, "admin-image-form-errors")

    page.fill("input[name='ports-1-port']", "8000")
    page.fill("input[name='env-0-name']", "HF_HOME")
    page.click("input[name=_continue]")
    expect(page.locator(".messagelist")).to_contain_text("was added successfully")
    image = Image.objects.get(name="trainer")
    assert image.cuda_version == ""
    assert image.ports == [
        {"port": 8888, "name": "JupyterLab", "app": "jupyter"},
        {"port": 8000, "name": "Again"},
    ]
    assert image.env == {"HF_HOME": "all"}
    screenshot(page, "admin-image-form")
