"""What a container reaches on the network: its own tenant's containers, never another tenant's,
never a service of the host, whatever address that listens on. Real containers through a real
agent (the oci runtime on Podman and on Docker, which also isolates its networks by itself),
whose API and SSH gateway listen on 0.0.0.0 as the README's production install has them."""

import ipaddress
import secrets
import socket
import subprocess

import docker
import pytest

from tests.agent.agents import SECRET, Agent
from tests.agent.test_access import grant
from tests.agent.test_oci_runtime import launch_body
from tests.conftest import BOTH_ENGINES

pytestmark = [pytest.mark.integration, pytest.mark.containers]
PAGE = "gpucloud demo"
REQUEST = "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {} 8888"


@pytest.fixture
def agent(oci_engine, tmp_path):
    args = ("--gpus", "4", "--runtime", "oci", "--engine-url", oci_engine.url)
    running = Agent(tmp_path / "state", args, SECRET, listen="0.0.0.0")
    try:
        running.wait_ready()
        yield running
        for alloc in running.client.get("/v1/allocations").json()["allocations"]:
            running.client.delete(f"/v1/allocations/{alloc['id']}")
    finally:
        running.kill()
        running.client.close()


@pytest.fixture
def engine(oci_engine):
    client = docker.DockerClient(base_url=oci_engine.url)
    yield client
    client.close()


@pytest.fixture
def launch(agent):
    """Launch an instance of `tenant` running the demo web server on 8888; answer its id."""
    gpus = iter(range(4))

    def start(tenant: str) -> str:
        instance = f"t{secrets.token_hex(4)}"
        body = launch_body(instance, None, gpu=next(gpus), tenant=tenant, pids=512)
        answer = agent.client.put(f"/v1/allocations/{instance}-a", json=body).json()
        assert answer["state"] == "running", answer["reason"]
        return instance

    return start


def _network(engine, instance: str) -> dict:
    (network,) = (
        engine.containers.get(f"gpucloud-{instance}").attrs["NetworkSettings"]["Networks"].values()
    )
    return network


def _in(oci_engine, instance: str, command: str) -> str:
    """What `command` prints in the instance's container (its errors too: an exec that failed
    shows why)."""
    done = oci_engine.cli("exec", f"gpucloud-{instance}", "sh", "-c", command)
    return done.stdout + done.stderr


def _host_addresses() -> list[str]:
    """The host's own IPv4 addresses (eth0's...), but loopback's and the container bridges'
    (those come and go as other tests' networks empty: the test names the ones it holds)."""
    listed = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True)
    words = [line.split() for line in listed.stdout.splitlines()]
    bridges = ("lo", "gpc", "podman", "docker", "br-", "cni", "veth")
    return [w[3].split("/")[0] for w in words if not w[1].startswith(bridges)]


@BOTH_ENGINES
def test_a_tenant_reaches_its_own_containers_and_never_another_tenants(
    agent, engine, launch, oci_engine
):
    acme, acme_too, globex = launch("acme"), launch("acme"), launch("globex")
    acme_net, globex_net = _network(engine, acme), _network(engine, globex)

    assert PAGE in _in(oci_engine, acme_too, REQUEST.format(acme_net["IPAddress"]))
    assert PAGE not in _in(oci_engine, globex, REQUEST.format(acme_net["IPAddress"]))
    assert PAGE not in _in(oci_engine, acme, REQUEST.format(globex_net["IPAddress"]))
    assert acme_net["NetworkID"] == _network(engine, acme_too)["NetworkID"]
    assert acme_net["NetworkID"] != globex_net["NetworkID"]

    # the agent reports its containers' subnets: the console refuses a host address in one
    # (tests/security/test_host_identity.py)
    inventory = agent.client.get("/v1/inventory").json()
    reported = [ipaddress.ip_network(subnet) for subnet in inventory["container_networks"]]
    for network in (acme_net, globex_net):
        assert any(ipaddress.ip_address(network["IPAddress"]) in n for n in reported), reported

    for instance in (acme, globex):  # the port proxy still reaches each one's own port
        answer = agent.client.get(
            f"/v1/instances/{instance}/ports/8888/", headers=grant("port", instance, 8888)
        )
        assert answer.status_code == 200 and PAGE in answer.text, answer.text


@BOTH_ENGINES
def test_no_service_of_the_host_is_reachable_from_a_container(agent, engine, launch, oci_engine):
    with socket.create_server(("0.0.0.0", 0), backlog=64) as standing_in:  # console, DB, Redis
        ports = [agent.port, agent.ssh_port, standing_in.getsockname()[1]]
        instance, other = launch("acme"), launch("globex")
        gateways = [_network(engine, instance)["Gateway"], _network(engine, other)["Gateway"]]
        addresses = [*gateways, *_host_addresses(), "127.0.0.1"]
        targets = [f"{address} {port}" for address in addresses for port in ports]

        for target in targets:  # from the host, every one answers
            address, port = target.split()
            socket.create_connection((address, int(port)), timeout=2).close()
        tries = " ".join(f"'{t}'" for t in targets)
        attempt = '(nc -w 2 $t -e true 2>/dev/null && echo "open $t" || echo "shut $t")'
        seen = _in(oci_engine, instance, f"for t in {tries}; do {attempt} & done; wait")
        assert sorted(seen.splitlines()) == sorted(f"shut {t}" for t in targets), seen

    engine_socket = oci_engine.url.removeprefix("unix://")
    mounts = engine.containers.get(f"gpucloud-{instance}").attrs["Mounts"]
    assert not [m for m in mounts if engine_socket.startswith(m["Source"])], mounts
    sockets = f"{engine_socket} /run/podman/podman.sock /var/run/docker.sock"
    assert _in(oci_engine, instance, f"ls {sockets} 2>/dev/null; echo done") == "done\n"
