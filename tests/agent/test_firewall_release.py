"""An agent that stops cleanly removes its install's nftables chains when no container runs on
its networks, and keeps them while one does: containers outlive their agent, and the chains
are what keep them from the host's services (issue 50 item 8)."""

import subprocess
import uuid

import docker
import pytest

from agent.devtools.engine import DEMO_IMAGE
from agent.networks import TenantNetworks

pytestmark = pytest.mark.containers


def chains() -> str:
    done = subprocess.run(["nft", "list", "table", "inet", "gpucloud"], capture_output=True)
    return done.stdout.decode()


def test_a_clean_stop_removes_the_chains_only_when_no_container_is_left_to_guard(
    container_engine,
):
    client = docker.DockerClient(base_url=container_engine.url)
    install = f"rel{uuid.uuid4().hex[:8]}"
    networks = TenantNetworks(client, install, "all", podman=True)
    network = networks.ensure("tenant-a")
    assert f"input_{install}" in chains()
    container = client.containers.run(DEMO_IMAGE, ["sleep", "300"], network=network, detach=True)
    try:
        assert not networks.release()
        assert f"input_{install}" in chains()
    finally:
        container.remove(force=True)
    assert networks.release()
    assert install not in chains()
    client.networks.get(network).remove()
    client.close()
