"""The JupyterLab image of `make images` (agent/images.py), built into the test engine's storage
and run through a real agent: JupyterLab answers on its port origin with the instance's token,
refuses without it, and takes the same token after a stop and a start.

The first build takes about a minute and a half (debootstrap and pip); its root file system is
kept in /var/cache/gpucloud, so later runs only import it (about 25 s)."""

import os
from urllib.parse import urlsplit

import httpx
import pytest

from agent.images import JUPYTER, build_image
from agent.podman import EngineError
from console.instances.models import Instance
from tests.factories import ImageFactory
from tests.instances.e2e import (
    api_client,
    make_catalog,
    make_tenant,
    start_agent,
    wait_for,
    wait_state,
)

pytestmark = [pytest.mark.integration, pytest.mark.containers, pytest.mark.timeout(300)]
JUPYTER_PORTS = [{"port": 8888, "name": "JupyterLab", "app": "jupyter"}]


@pytest.fixture(scope="module")
def jupyter_image(container_engine):
    """The image in the test engine; skipped where it cannot be built (no debootstrap, no
    Debian mirror or PyPI), except in CI."""
    try:
        build_image(JUPYTER, storage=container_engine.storage)
    except EngineError as error:
        if os.environ.get("CI"):
            pytest.fail(f"the JupyterLab image could not be built: {error}")
        pytest.skip(f"the JupyterLab image could not be built here: {error}")
    return JUPYTER.reference


@pytest.fixture
def cloud(stack, container_engine, jupyter_image):
    make_catalog()
    ImageFactory(name="jupyterlab", reference=jupyter_image, command=[], ports=JUPYTER_PORTS)
    _, membership = make_tenant()
    start_agent(stack, "gpu-1", gpus=2, runtime="oci", engine_url=container_engine.url)
    return api_client(stack, membership)


def _jupyter(stack, cloud, iid: int, token: str | None) -> httpx.Response:
    """GET /api/status on the instance's port origin (as an API client: its Bearer token),
    with `token` as Jupyter's."""
    origin = next(p for p in cloud.get(f"/instances/{iid}/").json()["ports"] if p["port"] == 8888)
    headers = {"Host": urlsplit(origin["origin_url"]).netloc, **cloud.headers}
    params = {"token": token} if token else {}
    return httpx.get(f"{stack.url}/api/status", headers=headers, params=params, timeout=10)


def signs_in(stack, cloud, iid: int, token: str) -> None:
    wait_for(
        lambda: _jupyter(stack, cloud, iid, token).status_code == 200,
        timeout=60,
        what="JupyterLab answering with the token",
        stack=stack,
    )
    assert _jupyter(stack, cloud, iid, token).json()["kernels"] == 0


def test_jupyterlab_answers_with_the_instances_token_only(stack, cloud):
    body = {"name": "notebook", "spec": "a100-quarter", "image": "jupyterlab"}
    created = cloud.post("/instances/", json=body)
    assert created.status_code == 202, created.text
    iid = created.json()["id"]
    wait_state(cloud, iid, "running", stack, timeout=60)
    token = Instance.objects.get(pk=iid).app_token
    signs_in(stack, cloud, iid, token)
    assert _jupyter(stack, cloud, iid, None).status_code == 403
    assert _jupyter(stack, cloud, iid, "not-" + token).status_code == 403
    logs = cloud.get(f"/instances/{iid}/logs/", params={"tail": 200}).json()["lines"]
    assert any("lab?token=..." in line for line in logs)  # Jupyter does not print it
    assert not any(token in line for line in logs)

    assert cloud.post(f"/instances/{iid}/stop/").status_code == 202
    wait_state(cloud, iid, "stopped", stack, timeout=60)
    assert cloud.post(f"/instances/{iid}/start/").status_code == 202
    wait_state(cloud, iid, "running", stack, timeout=60)
    signs_in(stack, cloud, iid, token)
