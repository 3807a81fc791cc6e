"""An image pull's progress as the tenant reads it, end to end: an image of several layers in a
real registry (Debian's docker-registry), pulled by a real agent with the `oci` runtime on
Podman, reported to the console over the agent's event stream."""

import re
import secrets

import pytest

from agent.devtools.engine import DEMO_IMAGE
from tests.factories import ImageFactory
from tests.instances.e2e import api_client, make_catalog, make_tenant, start_agent, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.containers]
EXTRA_LAYER_MB = 4
LAYERS = re.compile(r": (\d+) of (\d+) layers")
BYTES = re.compile(r"· ([\d.]+ [kMG]?B) of ([\d.]+ [kMG]?B)")


@pytest.fixture
def layered_image(container_engine, registry, tmp_path):
    """The demo image with two more layers of random data, in the registry only: the host
    lacks it. Answers (reference, its number of layers)."""
    reference = f"{registry}/gpucloud/layered:{secrets.token_hex(3)}"
    for name in ("a", "b"):
        (tmp_path / name).write_bytes(secrets.token_bytes(EXTRA_LAYER_MB * 1_000_000))
    (tmp_path / "Containerfile").write_text(f"FROM {DEMO_IMAGE}\nCOPY a /a\nCOPY b /b\n")
    built = container_engine.podman("build", "-t", reference, str(tmp_path))
    assert built.returncode == 0, built.stderr
    inspected = container_engine.podman(
        "image", "inspect", "--format", "{{len .RootFS.Layers}}", reference
    )
    layers = int(inspected.stdout)
    pushed = container_engine.podman("push", reference)
    assert pushed.returncode == 0, pushed.stderr
    assert container_engine.podman("rmi", reference).returncode == 0
    return reference, layers


def test_a_pull_reports_layers_and_bytes_done_of_total_up_to_all_of_them(
    stack, container_engine, layered_image
):
    reference, layers = layered_image
    make_catalog()
    ImageFactory(name="layered", reference=reference, command=["sleep", "1000"])
    _, membership = make_tenant()
    start_agent(stack, "gpu-1", gpus=2, runtime="oci", engine_url=container_engine.url)
    api = api_client(stack, membership)
    body = {"name": "cold", "spec": "a100-quarter", "image": "layered"}
    iid = api.post("/instances/", json=body).json()["id"]

    reasons = []  # each state reason the tenant could read while it started
    figures = []  # and each pull_progress (the bar's figures)

    def running():
        instance = api.get(f"/instances/{iid}/").json()
        if not reasons or reasons[-1] != instance["state_reason"]:
            reasons.append(instance["state_reason"])
        if instance["pull_progress"] and instance["pull_progress"] not in figures:
            figures.append(instance["pull_progress"])
        return instance["state"] == "running"

    wait_for(running, timeout=60, what="the instance running", stack=stack)
    notes = [e["message"] for e in api.get(f"/instances/{iid}/events/").json()["results"]]
    pulling = [m for m in notes if m.startswith(f"pulling {reference}")]
    assert len(pulling) == 1, notes  # one event per pull, however many reports it took
    pulled = [m for m in notes if m.startswith(f"pulled {reference} in ")]
    assert len(pulled) == 1, notes
    done, total = LAYERS.search(pulled[0]).groups()
    assert int(done) == int(total) == layers, pulled
    # Podman tells a layer's bytes once a second: a layer fetched faster has none to show
    if sizes := BYTES.search(pulled[0]):
        assert sizes[1] == sizes[2], pulled

    # what the tenant read on the way: layers done never went back
    counts = [int(LAYERS.search(r)[1]) for r in reasons if r and LAYERS.search(r)]
    assert counts == sorted(counts) and all(count <= layers for count in counts), reasons

    # the same reports as figures: the bar never went back nor past its totals
    assert figures, reasons
    assert {f["reference"] for f in figures} == {reference}
    assert all(f["layers_done"] <= f["layers_total"] <= layers for f in figures), figures
    assert all(f["bytes_done"] <= f["bytes_total"] for f in figures), figures
    done = [f["layers_done"] for f in figures]
    assert done == sorted(done), figures
    running_now = api.get(f"/instances/{iid}/").json()
    assert running_now["pull_progress"] is None  # running: no bar
