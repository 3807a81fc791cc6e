"""A launch asks the engine little (no look for an image it has seen, for the volume, for a
container of the same name), and still copes with what a host may hold: a container that an
earlier allocation of the instance left, an image removed since its last launch. On Podman
and Docker: each answers a name already taken and a pull in its own way."""

import secrets

import docker
import pytest

from agent.devtools.engine import DEMO_IMAGE
from tests.agent.test_oci_runtime import instance_logs, launch_body
from tests.conftest import BOTH_ENGINES

pytestmark = pytest.mark.containers


@pytest.fixture
def agent(start_agent, oci_engine):
    return start_agent("--gpus", "2", "--runtime", "oci", "--engine-url", oci_engine.url)


@pytest.fixture
def engine(oci_engine):
    client = docker.DockerClient(base_url=oci_engine.url)
    yield client
    client.close()


@BOTH_ENGINES
def test_a_container_left_by_an_earlier_allocation_is_replaced_its_output_kept(agent, engine):
    instance = f"t{secrets.token_hex(4)}"
    left = engine.containers.run(
        DEMO_IMAGE,
        ["echo", "the earlier run"],
        name=f"gpucloud-{instance}",
        labels={"gpucloud.instance": instance, "gpucloud.allocation": f"{instance}-a"},
        detach=True,
    )
    left.wait(timeout=30)

    answer = agent.client.put(
        f"/v1/allocations/{instance}-b", json=launch_body(instance, ["sleep", "60"])
    )

    assert answer.status_code == 201 and answer.json()["state"] == "running"
    container = engine.containers.get(f"gpucloud-{instance}")
    assert container.id != left.id
    assert container.labels["gpucloud.allocation"] == f"{instance}-b"
    assert "the earlier run" in instance_logs(agent, instance)
    agent.client.delete(f"/v1/allocations/{instance}-b")


@BOTH_ENGINES
def test_an_image_removed_since_the_last_launch_is_pulled_again(agent, oci_engine, registry):
    reference = f"{registry}/gpucloud/again:{secrets.token_hex(4)}"
    assert oci_engine.cli("tag", DEMO_IMAGE, reference).returncode == 0
    pushed = oci_engine.cli("push", reference)
    assert pushed.returncode == 0, pushed.stderr
    first, second = f"t{secrets.token_hex(4)}", f"t{secrets.token_hex(4)}"
    body = launch_body(first, ["sleep", "60"]) | {"image": reference}
    assert agent.client.put(f"/v1/allocations/{first}-a", json=body).json()["state"] == "running"
    agent.client.delete(f"/v1/allocations/{first}-a")
    assert oci_engine.cli("rmi", "--force", reference).returncode == 0  # behind its back

    body = launch_body(second, ["sleep", "60"]) | {"image": reference}
    answer = agent.client.put(f"/v1/allocations/{second}-a", json=body)

    assert answer.json()["state"] == "running", answer.json()
    assert oci_engine.cli("image", "inspect", reference).returncode == 0
    agent.client.delete(f"/v1/allocations/{second}-a")
