"""The launch form's images in headless Chromium, on hosts made in the database: each image
says where the chosen region can get it; one whose registry no host reaches is grayed out with
the reason, and comes back in a region whose hosts run anything; a spec that would go to the
host holding an image says it starts there cached."""

import pytest
from playwright.sync_api import expect

from accounts.roles import Role
from console.fleet.models import Host, HostImage
from tests.factories import ImageFactory
from tests.pages import screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SETTINGS = {"pre_pull": [], "mirror": "", "registries": ["docker.io", "quay.io"]}
CHECKS = [
    {"registry": "docker.io", "reachable": True, "error": "", "checked_at": 1.0},
    {"registry": "quay.io", "reachable": False, "error": "timed out", "checked_at": 1.0},
]


def option(page, name):
    return page.locator(f"[data-image-picker] [data-image='{name}']")


def test_the_form_shows_each_images_availability_and_grays_out_an_unreachable_one(
    page, live_server, catalog, tenant, make_member
):
    make_member(tenant, Role.MEMBER, username="mia")
    host = catalog.host("host-b", gpus=1)
    Host.objects.filter(pk=host.pk).update(image_settings=SETTINGS, registry_checks=CHECKS)
    HostImage.objects.create(host=host, reference="docker.io/" + catalog.image.reference,
                             image_id="sha256:1", size_bytes=8_100_000_000)  # fmt: skip
    ImageFactory(name="python", reference="python:3.12", description="Plain Python")
    ImageFactory(name="notebook-quay", reference="quay.io/team/notebook:1",
                 description="A notebook from Quay",
                 ports=[{"port": 8888, "name": "Jupyter", "app": "jupyter"}])  # fmt: skip
    catalog.host("sim-1", gpus=1, region=catalog.region2)  # a runtime without images
    sign_in(page, live_server.url, "mia")
    page.goto(f"{live_server.url}/instances/launch/")

    held, pulled, far = (option(page, n) for n in (catalog.image.name, "python", "notebook-quay"))
    expect(held.get_by_test_id("image-status")).to_have_text("on hosts")
    expect(held).to_contain_text("8.1 GB")
    expect(held.get_by_test_id("image-detail")).to_have_text(
        "Held by 1 host of Local 1 (8.1 GB): host-b."
    )
    expect(pulled.get_by_test_id("image-status")).to_have_text("pullable")
    expect(pulled).to_contain_text("Plain Python")
    expect(far.get_by_test_id("image-status")).to_have_text("registry unreachable")
    expect(far.get_by_test_id("image-detail")).to_contain_text(
        "No host of Local 1 can reach quay.io (timed out)"
    )
    expect(far.get_by_test_id("image-serves")).to_have_text("Serves JupyterLab (8888)")
    expect(far.locator("input")).to_be_disabled()
    # the default image (the first by name) cannot run here: the first that can is chosen
    expect(pulled.locator("input")).to_be_checked()
    expect(held.get_by_test_id("image-cached")).to_be_hidden()  # no spec chosen yet

    page.locator("tr[data-spec=a100-quarter]").click()
    expect(held.get_by_test_id("image-cached")).to_have_text("on host-b: cached")
    expect(pulled.get_by_test_id("image-cached")).to_be_hidden()
    screenshot(page, "instances-launch-images")

    page.select_option("#id_region", "local-2")  # its host runs anything: nothing to pull
    expect(far.locator("input")).to_be_enabled()
    expect(far.get_by_test_id("image-status")).to_have_text("on hosts")
    expect(far.get_by_test_id("image-detail")).to_contain_text("without images")
    expect(held.get_by_test_id("image-cached")).to_be_hidden()
    far.locator("input").check()
    page.select_option("#id_region", "local-1")  # it cannot run here: the choice moves off it
    expect(far.locator("input")).to_be_disabled()
    expect(far.locator("input")).not_to_be_checked()
    expect(page.locator("input[name=image]:checked")).to_have_count(1)
