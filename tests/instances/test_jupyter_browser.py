"""JupyterLab in Chromium, through the console: a member opens the instance's Jupyter link,
which leads through the console's grant to the port origin signed in with the instance's
token; a notebook's cell runs on its kernel (its websocket relayed by the console and the
agent, with the app's cookies and the port origin's Host). A viewer's link carries no token.

The image is tests/instances/test_jupyter_image.py's (a ~25 s import once built)."""

import os
import re

import pytest
from playwright.sync_api import expect

from accounts.models import Membership
from accounts.roles import Role
from console.instances.models import Instance
from tests.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.factories import MembershipFactory, UserFactory
from tests.instances import test_jupyter_image
from tests.instances.e2e import api_client, wait_state
from tests.pages import screenshot, sign_in, steady

pytestmark = [
    pytest.mark.integration,
    pytest.mark.containers,
    pytest.mark.browser,
    pytest.mark.timeout(300),
]
jupyter_image = test_jupyter_image.jupyter_image  # the fixtures: the image, and a cloud with it
cloud = test_jupyter_image.cloud


@pytest.fixture
def chromium():
    """Chromium that finds the ports' origins (*.localhost) on this machine."""
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[*CHROMIUM_ARGS, "--host-resolver-rules=MAP *.localhost 127.0.0.1"],
        )
        yield browser
        browser.close()
    del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


def test_a_member_opens_jupyterlab_signed_in_and_runs_a_cell(stack, cloud, chromium):
    body = {"name": "notebook", "spec": "a100-quarter", "image": "jupyterlab"}
    created = cloud.post("/instances/", json=body)
    assert created.status_code == 202, created.text
    iid = created.json()["id"]
    wait_state(cloud, iid, "running", stack, timeout=60)
    token = Instance.objects.get(pk=iid).app_token
    test_jupyter_image.signs_in(stack, cloud, iid, token)  # JupyterLab is up

    member = Membership.objects.get(user__username="mia")
    viewer = MembershipFactory(
        user=UserFactory(username="vic"), tenant=member.tenant, role=Role.VIEWER
    )
    (seen,) = api_client(stack, viewer).get(f"/instances/{iid}/").json()["ports"]
    assert "token" not in seen["url"] + seen["origin_url"]

    page = steady(chromium.new_context(viewport={"width": 1280, "height": 860}).new_page())
    page.set_default_timeout(30_000)
    sign_in(page, stack.url, "mia")
    page.goto(f"{stack.url}/instances/{iid}/")
    link = page.get_by_test_id("port-link")
    assert link.get_attribute("href") == f"/instances/{iid}/ports/8888/?token={token}"
    with page.expect_popup() as opened:
        link.click()
    lab = opened.value
    lab.set_default_timeout(60_000)
    port_origin = f"http://i{iid}-8888.ports.localhost:{stack.port}"
    expect(lab).to_have_url(re.compile(re.escape(port_origin) + "/lab"), timeout=30_000)

    lab.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
    editor = lab.locator(".jp-Notebook .jp-Cell .cm-content").first
    expect(editor).to_be_visible(timeout=30_000)
    idle = lab.get_by_text("Python 3 (ipykernel) | Idle")  # the kernel, over its websocket
    expect(idle).to_be_visible(timeout=60_000)
    editor.click()
    lab.keyboard.type("print(6*7)")
    expect(editor).to_have_text("print(6*7)")
    lab.keyboard.press("Shift+Enter")
    output = lab.locator(".jp-OutputArea-output").first
    expect(output).to_have_text("42", timeout=60_000)
    screenshot(lab, "jupyter")
    jupyters = {c["name"] for c in lab.context.cookies(port_origin)} - {"gpucloud-port"}
    assert any(name.startswith("username-") for name in jupyters)  # Jupyter's own sign-in
