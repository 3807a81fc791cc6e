"""The launch form's volume picker in headless Chromium, on a host made in the database: only
the chosen region's volumes are offered, a refused mount path is shown at the top and on the
picker, and a launch with a volume ticked attaches it at the path typed beside it."""

import pytest
from playwright.sync_api import expect

from console.catalog.models import Mode
from console.instances.models import Instance
from console.volumes import services
from console.volumes.models import Volume
from tests.pages import screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_launch_with_a_volume_picked(page, live_server, catalog, tenant, member):
    catalog.host(gpus=1, mode=Mode.SHARED)
    data = services.create_volume(tenant, name="data", size_gib=20, region=catalog.region)
    services.create_volume(tenant, name="far", size_gib=5, region=catalog.region2)
    sign_in(page, live_server.url, "mia")
    page.goto(f"{live_server.url}/instances/launch/")
    picker = page.get_by_test_id("volume-picker")
    expect(picker.locator("tr[data-volume=data]")).to_contain_text("20 GiB")
    expect(picker.locator("tr[data-volume=far]")).to_be_hidden()
    none_here = page.locator("#launch-volumes [data-role=no-volumes]")
    expect(none_here).to_be_hidden()
    page.select_option("#id_region", "local-2")
    expect(picker.locator("tr[data-volume=far]")).to_be_visible()
    expect(picker.locator("tr[data-volume=data]")).to_be_hidden()
    page.select_option("#id_region", "local-1")
    expect(none_here).to_be_hidden()

    page.locator("tr[data-spec=a100-quarter] input").check()
    page.fill("#id_name", "trainer")
    page.check(f"#id_volume_{data.pk}")
    page.fill(f"[name=mount_path_{data.pk}]", "/workspace")
    page.click("[data-testid=launch-submit]")
    expect(page.get_by_test_id("error-summary")).to_contain_text(
        "Volumes: data: /workspace is the container's own"
    )
    assert not Instance.objects.exists()
    expect(page.locator(f"#id_volume_{data.pk}")).to_be_checked()  # the choice stays
    screenshot(page, "volumes-launch-picker-error")

    page.fill(f"[name=mount_path_{data.pk}]", "/data")
    page.click("[data-testid=launch-submit]")
    expect(page.locator("h1")).to_contain_text("trainer")
    instance = Instance.objects.get(name="trainer")
    attached = Volume.objects.get(pk=data.pk)
    assert (attached.instance_id, attached.mount_path) == (instance.pk, "/data")
