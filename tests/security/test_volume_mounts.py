"""A tenant's volumes cannot reach past themselves: a mount path that climbs out (`/../etc`),
lands on the container's system (/proc, /dev, /etc …) or on the instance's own disk is refused
by the console and again by the agent; a volume name with path characters is refused; a
symlink at the mount path in the tenant's image resolves inside the container, never on the
host; a volume's disk is mounted only for its own owner and tenant. Podman and Docker."""

import secrets
import uuid
from pathlib import Path

import docker
import pytest

from agent.allocations import parse_spec
from agent.errors import ApiError
from console.volumes.services import mount_path_error
from tests.agent.agents import wait_for
from tests.agent.test_oci_runtime import launch_body, new_instance_id
from tests.conftest import BOTH_ENGINES
from tests.security.test_containers_confined import running_agent

CLIMBS = ["/../etc", "/data/../../etc", "/./proc", "/data/.", "//etc", "/data//x", "data", ""]
SYSTEM = ["/", "/proc", "/proc/self", "/sys", "/dev", "/dev/pts", "/etc", "/usr/bin", "/var/run",
          "/run", "/bin", "/lib64", "/workspace", "/workspace/sub"]  # fmt: skip
ODD = ["/da ta", "/data\n", "/data;rm", "/dätä", "/data/", "/" + "x" * 70]
GPUS = [{"index": 0, "model": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-0"}]


def _body(**volume) -> dict:
    entry = {"name": "gpucloud-v1", "owner": "volume-1", "size_gib": 1, "mount_path": "/data"}
    return {"mode": "whole", "gpus": [0], "volumes": [{**entry, **volume}]}


@pytest.mark.parametrize("path", CLIMBS + SYSTEM + ODD)
def test_the_console_refuses_the_mount_path(path):
    assert mount_path_error(path) is not None


@pytest.mark.parametrize("path", CLIMBS + SYSTEM + ODD)
def test_the_agent_refuses_the_mount_path(path):
    with pytest.raises(ApiError) as refused:
        parse_spec(_body(mount_path=path), GPUS)
    assert refused.value.status == 400


@pytest.mark.parametrize("path", ["/data", "/mnt/data", "/home/me/datasets", "/opt/x_1.2-b"])
def test_plain_paths_pass(path):
    assert mount_path_error(path) is None
    assert parse_spec(_body(mount_path=path), GPUS)["volumes"][0]["mount_path"] == path


@pytest.mark.parametrize("name", ["../x", "a/b", "/etc", ".hidden", "x" * 200, ""])
def test_the_agent_refuses_a_disk_name_with_path_characters(name):
    with pytest.raises(ApiError):
        parse_spec(_body(name=name), GPUS)


@pytest.mark.parametrize("owner", ["../volume-1", "volume 1", "", "a/b"])
def test_the_agent_refuses_an_odd_owner(owner):
    with pytest.raises(ApiError):
        parse_spec(_body(owner=owner), GPUS)


def test_two_volumes_on_one_path_or_one_inside_another():
    twice = _body()
    twice["volumes"].append({**twice["volumes"][0], "name": "gpucloud-v2", "owner": "volume-2",
                             "mount_path": "/data/inner"})  # fmt: skip
    with pytest.raises(ApiError):
        parse_spec(twice, GPUS)


@pytest.mark.integration
@pytest.mark.containers
@BOTH_ENGINES
def test_a_symlink_at_the_mount_path_stays_in_the_container(oci_engine, tmp_path):
    """The tenant's image has /data -> /etc: its volume is mounted at the container's /etc
    (the engine resolves the path inside the container's root), what it writes lands in the
    volume, and nothing on the host's /etc."""
    client = docker.DockerClient(base_url=oci_engine.url)
    reference = f"localhost/gpucloud/symlinked-{secrets.token_hex(4)}:latest"
    maker = client.containers.run(
        "localhost/gpucloud/demo:latest", ["sh", "-c", "ln -s /etc /data"], detach=True
    )
    maker.wait()
    maker.commit(repository=reference.rsplit(":", 1)[0], tag="latest")
    maker.remove()
    marker = f"planted-{uuid.uuid4().hex}"
    instance, disk = new_instance_id(), f"gpucloud-{secrets.token_hex(16)}"
    body = launch_body(instance, ["sh", "-c", f"echo x > /data/{marker}; sleep 1000"])
    body["image"] = reference
    body["volumes"] = [{"name": disk, "owner": "volume-9", "size_gib": 1, "mount_path": "/data"}]
    with running_agent(oci_engine, tmp_path / "state") as agent:
        try:
            alloc = agent.client.put(f"/v1/allocations/{instance}-0", json=body).json()
            assert alloc["state"] == "running", alloc
            assert wait_for(lambda: list(tmp_path.glob(f"**/{disk}/mnt/{marker}")))
            assert not Path(f"/etc/{marker}").exists()
        finally:
            agent.client.delete(f"/v1/allocations/{instance}-0")
            query = {"owner": "volume-9", "tenant": "1"}
            assert agent.client.delete(f"/v1/volumes/{disk}", params=query).status_code == 204
            client.images.remove(reference, force=True)
            client.close()


@pytest.mark.integration
@pytest.mark.containers
def test_a_volume_is_mounted_only_for_its_owner_and_tenant(container_engine, tmp_path):
    disk = f"gpucloud-{secrets.token_hex(16)}"
    owner, rogue, other = new_instance_id(), new_instance_id(), new_instance_id()

    def put(instance, tenant, volume_owner):
        body = launch_body(instance, ["sh", "-c", "ls /data; sleep 1000"], tenant=tenant)
        body["volumes"] = [{"name": disk, "owner": volume_owner, "size_gib": 1,
                            "mount_path": "/data"}]  # fmt: skip
        return agent.client.put(f"/v1/allocations/{instance}-0", json=body).json()

    with running_agent(container_engine, tmp_path / "state") as agent:
        try:
            assert put(owner, "1", "volume-7")["state"] == "running"
            agent.client.delete(f"/v1/allocations/{owner}-0")
            foreign = put(rogue, "2", "volume-7")  # another tenant names it
            assert foreign["state"] == "failed" and "volume_foreign" in foreign["reason"]
            agent.client.delete(f"/v1/allocations/{rogue}-0")
            stolen = put(other, "1", "volume-8")  # another volume's owner names it
            assert stolen["state"] == "failed" and "volume_foreign" in stolen["reason"]
            agent.client.delete(f"/v1/allocations/{other}-0")
            refused = agent.client.delete(
                f"/v1/volumes/{disk}", params={"owner": "volume-8", "tenant": "1"}
            )
            assert refused.status_code == 409
            bad = agent.client.delete("/v1/volumes/..%2Fetc", params={"owner": "v", "tenant": "1"})
            assert bad.status_code in (400, 404)
        finally:
            agent.client.delete(f"/v1/volumes/{disk}", params={"owner": "volume-7", "tenant": "1"})
