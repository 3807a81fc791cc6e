"""A disk belongs to one instance, with real containers through the real agent: an allocation
that names another instance's disk is refused, and so is a volume an earlier install left on
the engine under the name, whoever it names (or if it names no one); the console's names
(gpucloud-<uuid>) never meet an earlier install's. Engine volumes on Podman and on Docker."""

import secrets

import docker
import pytest

from agent.devtools.engine import DEMO_IMAGE
from tests.agent.agents import wait_for
from tests.agent.test_oci_runtime import launch_body, new_instance_id
from tests.conftest import BOTH_ENGINES
from tests.security.test_containers_confined import agent as confined_agent  # noqa: F401
from tests.security.test_containers_confined import running_agent

pytestmark = [pytest.mark.integration, pytest.mark.containers]
WRITE_SECRET = "echo private > /workspace/secret; sleep 1000"
SHOW_WORKSPACE = "ls /workspace; cat /workspace/secret 2>&1; sleep 1000"


@pytest.fixture
def agent(oci_engine, tmp_path):
    with running_agent(oci_engine, tmp_path / "state") as running:
        yield running


@pytest.fixture
def engine(oci_engine):
    client = docker.DockerClient(base_url=oci_engine.url)
    yield client
    client.close()


def _put(agent, instance: str, command: str, disk: str, gpu: int = 0, tenant: str = "1") -> dict:
    body = launch_body(instance, ["sh", "-c", command], gpu=gpu, tenant=tenant)
    body["volume"]["name"] = disk
    return agent.client.put(f"/v1/allocations/{instance}-{gpu}", json=body).json()


def _left_by_an_earlier_install(engine, name: str, labels: dict[str, str]) -> None:
    """An engine volume with a file in it, as an earlier agent (or anyone) left it."""
    engine.volumes.create(name, labels=labels)
    engine.containers.run(
        DEMO_IMAGE,
        ["sh", "-c", "echo theirs > /v/secret"],
        volumes={name: {"bind": "/v", "mode": "rw"}},
        remove=True,
    )


def _lines(agent, instance: str) -> list[str]:
    return agent.client.get(f"/v1/instances/{instance}/logs", params={"tail": 20}).json()["lines"]


def test_an_allocation_naming_another_instances_disk_is_refused(agent):
    owner, rogue = new_instance_id(), new_instance_id()
    disk = f"gpucloud-{secrets.token_hex(16)}"
    assert _put(agent, owner, WRITE_SECRET, disk)["state"] == "running"

    for gpu, (instance, tenant) in enumerate(((rogue, "1"), (rogue, "2"), (owner, "2")), 1):
        refused = _put(agent, instance, SHOW_WORKSPACE, disk, gpu=gpu, tenant=tenant)
        assert refused["state"] == "failed"
        assert refused["reason"].startswith(f"volume_foreign: {disk} belongs to instance {owner}")
    assert "private" not in _lines(agent, rogue)


@BOTH_ENGINES
def test_an_earlier_installs_volume_of_the_same_name_is_never_attached(agent, engine):
    instance = new_instance_id()
    for gpu, labels in enumerate(
        (
            {"gpucloud.instance": "7", "gpucloud.tenant": "1"},  # another instance's
            {"gpucloud.instance": instance, "gpucloud.tenant": "9"},  # another tenant's
            {},  # made by someone else
        )
    ):
        name = f"gpucloud-{secrets.token_hex(6)}"
        _left_by_an_earlier_install(engine, name, labels)
        refused = _put(agent, instance, SHOW_WORKSPACE, name, gpu=gpu)
        assert refused["state"] == "failed"
        assert refused["reason"].startswith(f"volume_foreign: the engine's volume {name}")
    assert "theirs" not in _lines(agent, instance)


def test_a_new_install_names_its_disk_anew_and_sees_nothing_of_the_old_one(agent, engine):
    instance = new_instance_id()
    _left_by_an_earlier_install(
        engine, f"gpucloud-{instance}", {"gpucloud.instance": instance, "gpucloud.tenant": "1"}
    )
    disk = f"gpucloud-{secrets.token_hex(16)}"  # the console's name for the new instance
    assert _put(agent, instance, SHOW_WORKSPACE, disk)["state"] == "running"
    missing = "cat: can't open '/workspace/secret': No such file or directory"
    wait_for(lambda: missing in _lines(agent, instance))
    assert "theirs" not in _lines(agent, instance)


@BOTH_ENGINES
def test_a_volume_an_earlier_agent_made_for_the_instance_is_still_its_own(agent, engine):
    """An instance from before the names (gpucloud-<id>) keeps its data, and terminate takes
    it away with the instance's disks, and nothing of another instance."""
    instance, other = new_instance_id(), new_instance_id()
    legacy = f"gpucloud-{instance}"
    _left_by_an_earlier_install(engine, legacy, {"gpucloud.instance": instance})
    assert _put(agent, instance, SHOW_WORKSPACE, legacy)["state"] == "running"
    wait_for(lambda: "theirs" in _lines(agent, instance))
    other_disk = f"gpucloud-{secrets.token_hex(16)}"
    assert _put(agent, other, WRITE_SECRET, other_disk, gpu=1)["state"] == "running"

    assert agent.client.delete(f"/v1/allocations/{instance}-0").status_code == 204
    assert agent.client.delete(f"/v1/instances/{instance}").status_code == 204
    assert not engine.volumes.list(filters={"name": legacy})
    assert (agent.state_dir / "disks" / other_disk / "disk.img").exists()


def test_an_earlier_instances_output_is_never_shown_to_a_new_one_of_the_same_id(
    start_agent,
):
    """A console whose database was reset (or another install) gives the id 7 to a new
    instance of another tenant: the agent's kept output of the old instance 7 is not its."""
    agent = start_agent("--gpus", "1", "--mode", "whole", "--runtime", "process")

    def run(alloc_id: str, disk: str, line: str) -> None:
        body = {
            "mode": "whole",
            "gpus": [0],
            "command": ["sh", "-c", f"echo {line}"],
            "labels": {"instance": "7"},
            "volume": {"name": disk},
        }
        assert agent.client.put(f"/v1/allocations/{alloc_id}", json=body).status_code == 201
        assert wait_for(lambda: line in _kept_lines(agent))
        assert agent.client.delete(f"/v1/allocations/{alloc_id}").status_code == 204

    run("old-1", "gpucloud-" + "a" * 32, "the-old-tenants-secret")
    run("old-2", "gpucloud-" + "a" * 32, "its-second-run")
    assert {"the-old-tenants-secret", "its-second-run"} <= set(_kept_lines(agent))  # the same disk
    run("new-1", "gpucloud-" + "b" * 32, "the-new-tenants-line")
    assert _kept_lines(agent) == ["the-new-tenants-line"]


def _kept_lines(agent) -> list[str]:
    return agent.client.get("/v1/instances/7/logs?tail=100").json()["lines"]
