"""The PyTorch image of make run and `make images` (agent/images.py), built into the test engine's
storage and launched through a real agent: its command trains a small network, printing the
loss as it falls (the instance's logs), and then stays up until a stop, which ends it at once.

The first build takes minutes (debootstrap, pip with PyTorch's 190 MB wheel from this machine's
disk); its root file system is kept in /var/cache/gpucloud, so later runs only import it."""

import os
import re

import pytest

from agent.images import PYTORCH, build_image
from agent.podman import EngineError
from tests.factories import ImageFactory
from tests.instances.e2e import (
    api_client,
    make_catalog,
    make_tenant,
    start_agent,
    wait_for,
    wait_state,
)

pytestmark = [pytest.mark.integration, pytest.mark.containers, pytest.mark.timeout(600)]
LOSS = re.compile(r"step +(\d+) +loss ([0-9.]+)")


@pytest.fixture(scope="module")
def pytorch_image(container_engine):
    """The image in the test engine; skipped where it cannot be built (no debootstrap, no
    Debian mirror, neither the wheel on disk nor PyPI), except in CI."""
    try:
        build_image(PYTORCH, storage=container_engine.storage)
    except EngineError as error:
        if os.environ.get("CI"):
            pytest.fail(f"the PyTorch image could not be built: {error}")
        pytest.skip(f"the PyTorch image could not be built here: {error}")
    return PYTORCH.reference


def losses(lines: list[str]) -> list[float]:
    """The losses the training printed, in order."""
    return [float(found.group(2)) for line in lines if (found := LOSS.search(line))]


def falls(values: list[float]) -> bool:
    """A training's loss fell: to a tenth of where it started, and by the end lower than at any
    printed step before (a step may rise a little on the way: Adam)."""
    return len(values) >= 5 and values[-1] < values[0] / 10 and values[-1] == min(values)


def test_the_pytorch_image_trains_and_its_logs_show_the_loss_falling(
    stack, container_engine, pytorch_image
):
    make_catalog()
    ImageFactory(name="pytorch", reference=pytorch_image, command=[], ports=[])
    _, membership = make_tenant()
    start_agent(stack, "gpu-1", gpus=2, runtime="oci", engine_url=container_engine.url)
    cloud = api_client(stack, membership)
    body = {"name": "trainer", "spec": "a100-quarter", "image": "pytorch"}
    created = cloud.post("/instances/", json=body)
    assert created.status_code == 202, created.text
    iid = created.json()["id"]
    wait_state(cloud, iid, "running", stack, timeout=120)

    def logs() -> list[str]:
        return cloud.get(f"/instances/{iid}/logs/", params={"tail": 200}).json()["lines"]

    wait_for(lambda: any("done" in line for line in logs()), 180, "the training", stack)
    lines = logs()
    assert lines[0].startswith("training on cpu with torch 2.13.0+cpu: 300 steps"), lines
    assert falls(losses(lines)), lines
    assert cloud.get(f"/instances/{iid}/").json()["state"] == "running"  # up for its terminal
    assert cloud.post(f"/instances/{iid}/stop/").status_code == 202
    wait_state(cloud, iid, "stopped", stack, timeout=60)


def test_falls():
    assert falls([1.5, 0.6, 0.3, 0.35, 0.1, 0.05])
    assert not falls([1.5, 0.6, 0.3, 0.02, 0.1])  # rose again at the end
    assert not falls([1.0, 0.9, 0.8, 0.7, 0.6])  # hardly learnt
