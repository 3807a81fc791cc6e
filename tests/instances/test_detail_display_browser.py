"""The instance page in headless Chromium, on an instance made in the database: its command as
the argv it is (copied back, it runs the same), an image without CUDA says no CUDA version,
the cards keep apart, and the terminal offers to connect."""

import shlex

import pytest
from playwright.sync_api import expect

from accounts.roles import Role
from console.instances.models import State
from tests.factories import ImageFactory
from tests.instances.helpers import make_instance
from tests.pages import screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
COMMAND = ["sh", "-c", 'echo start SEED=$SEED; sleep "1 2"']


@pytest.fixture
def mia(tenant, make_member):
    return make_member(tenant, Role.MEMBER, username="mia")


def test_the_command_copies_back_as_it_runs(page, live_server, catalog, tenant, mia):
    instance = make_instance(catalog, tenant, state=State.RUNNING, command=COMMAND)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    sign_in(page, live_server.url, "mia")
    page.goto(f"{live_server.url}/instances/{instance.pk}/")

    line = page.get_by_test_id("command-line")
    expect(line).to_have_text("sh -c 'echo start SEED=$SEED; sleep \"1 2\"'")
    page.get_by_test_id("command").get_by_role("button", name="Copy").click()
    copied = page.evaluate("navigator.clipboard.readText()")
    assert shlex.split(copied) == COMMAND
    expect(page.get_by_test_id("image")).to_contain_text("CUDA 12.4")  # an image with CUDA

    # the unconnected terminal says what to do; the Events card does not touch it
    terminal = page.get_by_test_id("terminal")
    expect(terminal.get_by_test_id("terminal-connect")).to_be_visible()
    expect(terminal).to_contain_text(f"Connect to open a shell in {instance.name}")
    events = page.get_by_test_id("events").bounding_box()
    card = page.locator("[data-terminal]").bounding_box()
    assert card["y"] - (events["y"] + events["height"]) >= 16, (events, card)
    screenshot(page, "instances-detail-display")


@pytest.mark.parametrize("cuda", ["", "-"])
def test_an_image_without_cuda_shows_no_cuda_version(page, live_server, catalog, tenant, mia, cuda):
    image = ImageFactory(
        name="demo-busybox", reference="localhost/gpucloud/demo:1", cuda_version=cuda
    )
    instance = make_instance(catalog, tenant, state=State.STOPPED)
    instance.image = image
    instance.save(update_fields=["image"])
    sign_in(page, live_server.url, "mia")
    page.goto(f"{live_server.url}/instances/{instance.pk}/")
    expect(page.get_by_test_id("image")).to_contain_text("demo-busybox")
    expect(page.get_by_test_id("image")).not_to_contain_text("CUDA")
    expect(page.get_by_test_id("command")).to_have_text("the image's own")
