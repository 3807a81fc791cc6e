"""Fixtures of the security tests: an agent with the oci runtime and its SSH gateway on real
Podman, with an instance running the demo image."""

import secrets

import asyncssh
import pytest

from tests.agent.agents import free_port
from tests.agent.conftest import start_agent  # noqa: F401 - a fixture of these tests
from tests.agent.test_oci_runtime import launch_body
from tests.fleet.conftest import a100, region, register, staff_client  # noqa: F401 - likewise
from tests.security.gateway import Gateway


@pytest.fixture
def gateway(start_agent, container_engine, tmp_path):  # noqa: F811
    """The instance runs the demo image's web server; keys `laptop` and `desktop` may log in."""
    keys = {}
    for name in ("laptop", "desktop"):
        key = asyncssh.generate_private_key("ssh-ed25519", comment=name)
        path = tmp_path / name
        path.write_bytes(key.export_private_key())
        path.chmod(0o600)
        keys[name] = (key, path)
    port = free_port()
    agent = start_agent(
        "--gpus", "2", "--runtime", "oci", "--engine-url", container_engine.url,
        "--ssh-listen", f"127.0.0.1:{port}",
    )  # fmt: skip
    instance = f"t{secrets.token_hex(4)}"
    made = Gateway(agent, port, instance, keys, container_engine)
    made.set_keys("laptop", "desktop")
    body = launch_body(instance, None)
    assert agent.client.put(f"/v1/allocations/{instance}-a", json=body).json()["state"] == "running"
    return made
