"""A launch from a template in one click, in headless Chromium against the real stack (ASGI
server, Celery worker) and a real simulated agent: the Templates page's Launch button opens
the new instance's page, named for its spec, and it runs."""

import re

import pytest
from playwright.sync_api import expect

from console import secret_env
from console.catalog.models import Image, Spec
from console.instances.models import Instance
from console.launch_templates import services
from tests.instances.e2e import make_catalog, make_tenant, start_agent
from tests.pages import screenshot, sign_in

pytestmark = [pytest.mark.integration, pytest.mark.browser]


def test_launch_from_a_template_in_one_click(stack, page):
    make_catalog()
    tenant, _ = make_tenant()
    start_agent(stack, "gpu-1", gpus=2)
    services.create_template(
        tenant, name="trainer", spec=Spec.objects.get(code="a100-quarter"),
        image=Image.objects.first(), env={"SEED": "7"}, secrets={"HF_TOKEN": "hf_browser"},
    )  # fmt: skip
    services.create_template(
        None, name="PyTorch + JupyterLab", spec=Spec.objects.get(code="a100-half")
    )
    sign_in(page, stack.url, "mia")
    page.goto(f"{stack.url}/templates/")
    expect(page.get_by_test_id("published-templates")).to_contain_text("PyTorch + JupyterLab")
    row = page.locator("tr[data-template=trainer]")
    expect(row).to_contain_text(f"HF_TOKEN={secret_env.MASK}")
    assert "hf_browser" not in page.content()

    row.get_by_test_id("launch-template").click()
    expect(page.locator("h1")).to_contain_text(re.compile(r"a100-quarter-[a-z]+-[a-z]+"))
    expect(page.locator("h1 [data-role=state]")).to_have_text("running", timeout=30_000)
    instance = Instance.objects.get()
    assert page.url.endswith(f"/instances/{instance.pk}/")
    assert instance.env == {"SEED": "7"}
    assert secret_env.open_all(instance.secret_env) == {"HF_TOKEN": "hf_browser"}
    expect(page.get_by_test_id("secrets")).to_contain_text(f"HF_TOKEN={secret_env.MASK}")
    assert "hf_browser" not in page.content()
    screenshot(page, "templates-one-click-launch")
