"""A fresh `make run`, nothing else run (the README's one command): it builds the demo catalog's
JupyterLab and PyTorch images into its agents' engine in the background while the console
serves, and the fleet page says how far. Once built, in Chromium, a tenant launches the PyTorch
image from the launch form and its logs show the loss falling; a JupyterLab instance's Open
JupyterLab shows JupyterLab signed in, no token asked.

The images' root file systems are the build cache's (/var/cache/gpucloud, agent/images.py):
the first build on a machine takes minutes, later ones an import of each."""

import json
import os
import re
import signal
import time

import pytest
from playwright.sync_api import expect

from console import processes
from tests.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.instances.test_pytorch_image import falls, losses
from tests.pages import screenshot, steady
from tests.test_launcher import make_run_env, start_make_run, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.containers,
    pytest.mark.browser,
    pytest.mark.timeout(1500),
]
PYTORCH = "localhost/gpucloud/pytorch:latest"
JUPYTER = "localhost/gpucloud/jupyter:latest"
# make run's own start (collectstatic the first time), then the images' build or import
START_SECONDS, BUILD_SECONDS = 600, 900


@pytest.fixture(scope="module")
def make_run(tmp_path_factory):
    """make run as the README starts it, the background build included; Ctrl-C at the end."""
    tmp = tmp_path_factory.mktemp("make-run")
    var, port = tmp / "var", processes.free_port()
    env = {**make_run_env(var, port), "GPUCLOUD_BUILD_IMAGES": "1"}
    log_path = tmp / "make-run.log"
    with log_path.open("wb") as log:
        launcher = start_make_run(env, log)
    try:
        wait_for(
            lambda: "Press Ctrl-C" in log_path.read_text(),
            START_SECONDS,
            "make run",
            log_path,
            launcher,
        )
        output = log_path.read_text()
        if "workloads: containers through Podman" not in output:
            pytest.skip("make run runs no containers here (root and Podman needed)")
        assert "JupyterLab and PyTorch being built in the background" in output
        yield f"http://127.0.0.1:{port}", var
        os.killpg(launcher.pid, signal.SIGINT)
        assert launcher.wait(timeout=300) == 0, log_path.read_text()[-4000:]
    finally:
        if launcher.poll() is None:
            launcher.terminate()
            launcher.wait(timeout=120)


@pytest.fixture(scope="module")
def chromium():
    """Chromium that finds the ports' origins (*.localhost) on this machine."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[*CHROMIUM_ARGS, "--host-resolver-rules=MAP *.localhost 127.0.0.1"],
        )
        yield browser
        browser.close()


def signed_in(chromium, url: str, username: str, password: str):
    page = steady(chromium.new_context(viewport={"width": 1280, "height": 900}).new_page())
    page.set_default_timeout(30_000)
    page.goto(f"{url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_load_state()
    return page


@pytest.fixture(scope="module")
def built(make_run, chromium):
    """The operator watches the build on the fleet page until both images are built."""
    url, var = make_run
    page = signed_in(chromium, url, "operator", "operator-gpu-demo")
    page.goto(f"{url}/fleet/")
    builds = page.get_by_test_id("image-builds")
    expect(builds).to_contain_text(JUPYTER)
    expect(builds).to_contain_text(PYTORCH)
    deadline = time.monotonic() + BUILD_SECONDS
    while page.locator("[data-reference][data-state=built]").count() < 2:
        failed = page.locator("[data-state=failed]")
        assert failed.count() == 0, failed.first.inner_text()
        assert time.monotonic() < deadline, (var / "images.log").read_text()[-4000:]
        time.sleep(5)
        page.reload()
    screenshot(page, "fleet-images-built")
    states = json.loads((var / "image-builds.json").read_text())["images"]
    assert {image["state"] for image in states.values()} == {"built"}
    page.context.close()
    return url


def launch(page, url: str, name: str, image: str) -> None:
    """Fill the launch form and submit it: filled again where the page came back empty (steady
    loads it again when a container's network change dropped one of its scripts)."""
    radio = page.locator(f'input[name=image][value="{image}"]')
    deadline = time.monotonic() + 90  # the agents see a built image at their next inventory
    page.goto(f"{url}/instances/launch/")
    while not radio.is_enabled() and time.monotonic() < deadline:
        page.wait_for_timeout(2000)
        page.reload()
    expect(page.locator("[data-role=spec-counts]")).to_contain_text("can run here")
    spec = page.locator("#spec-a100-quarter")
    for _ in range(3):
        page.fill("#id_name", name)
        radio.check()
        spec.click()
        if spec.is_checked() and page.input_value("#id_name") == name:
            break
        page.wait_for_timeout(1000)
    expect(spec).to_be_checked()
    page.click("[data-testid=launch-submit]")
    try:  # the launch's own page, which a busy machine may take seconds to answer
        expect(page).to_have_url(re.compile(r"/instances/\d+/$"), timeout=60_000)
    except AssertionError:
        raise AssertionError(page.get_by_test_id("error-summary").all_inner_texts()) from None
    expect(page.locator("h1")).to_contain_text(name)


def test_a_tenant_launches_pytorch_from_the_form_and_its_logs_show_the_loss_falling(
    built, chromium
):
    page = signed_in(chromium, built, "alice", "alice-gpu-demo")
    launch(page, built, "trainer", "pytorch")
    logs = page.get_by_test_id("logs")
    expect(logs).to_contain_text("done: run python", timeout=240_000)
    lines = logs.inner_text().splitlines()
    assert any(line.startswith("training on cpu with torch 2.13.0+cpu") for line in lines), lines
    assert falls(losses(lines)), lines
    screenshot(page, "pytorch-logs")
    page.context.close()


def test_jupyterlab_opens_signed_in(built, chromium):
    page = signed_in(chromium, built, "alice", "alice-gpu-demo")
    launch(page, built, "lab", "jupyterlab")  # the demo has a "notebook"
    link = page.get_by_test_id("port-link")
    expect(link).to_have_text("Open JupyterLab", timeout=180_000)
    with page.expect_popup() as opened:
        link.click()
    lab = opened.value
    # JupyterLab listens some seconds after its container starts: until then the console's page
    # says nothing listens yet, and a person loads it again
    at_lab = re.compile(r"^http://i\d+-8888\.ports\.localhost:\d+/lab")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        lab.wait_for_load_state()
        if at_lab.match(lab.url):
            break
        if lab.get_by_text("Nothing is listening on this port").count():
            time.sleep(3)
            lab.reload()
        else:  # on its way to JupyterLab's /lab
            time.sleep(1)
    expect(lab).to_have_url(at_lab, timeout=30_000)
    expect(lab.locator(".jp-LauncherCard").first).to_be_visible(timeout=120_000)
    expect(lab.locator("input[type=password]")).to_have_count(0)  # no token asked
    screenshot(lab, "make-run-jupyterlab")
    page.context.close()
