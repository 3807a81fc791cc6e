"""Finding 14: the console calls an agent only where an operator allows (AGENT_ALLOWED_NETWORKS,
loopback and private ranges by default), never at a link-local or cloud metadata address: an
agent's advertised address cannot turn the console into a proxy to internal services."""

import ipaddress
import socket

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from console.env import env_networks
from console.fleet import services
from console.fleet.models import Host
from tests.fleet.conftest import agent_client_for, make_inventory, post_json

pytestmark = pytest.mark.django_db

REFUSED = [
    "http://169.254.169.254/",  # AWS, GCP, Azure, OCI metadata
    "http://169.254.169.254:80/latest/meta-data/",
    "http://[fe80::1]:9101",
    "http://[fd00:ec2::254]/",  # AWS metadata over IPv6 (inside fc00::/7)
    "http://100.100.100.200/",  # Alibaba Cloud metadata
    "http://[::ffff:169.254.169.254]/",
    "http://0.0.0.0:9101",
    "http://8.8.8.8:9101",  # public: not allowed unless an operator says so
    "http://no-such-host.invalid:9101",
    "http://metadata.google.internal/",  # resolves to 169.254.169.254 (see the fixture)
    "http://127.0.0.1:notaport",
    "file:///etc/passwd",
]
ALLOWED = [
    "http://127.0.0.1:9101",
    "http://localhost:9101",
    "http://10.1.2.3:9101/",
    "https://172.20.0.5:9101",
    "http://192.168.1.5:9101",
    "http://[::1]:9101",
    "http://[fd12:3456::7]:9101",
    "http://gpu-node-7:9101",  # a short cluster name resolving into a private range
]


@pytest.fixture(autouse=True)
def resolver(monkeypatch):
    """Names resolve as a cluster's DNS would; nothing leaves this machine."""
    names = {
        "localhost": ["127.0.0.1", "::1"],
        "gpu-node-7": ["10.0.3.7"],
        "metadata.google.internal": ["169.254.169.254"],
        "sneaky": ["10.0.3.8", "169.254.169.254"],  # one good address is not enough
    }

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, 0))
            for ip in names[host]
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def register_at(region, address, hostname="host-x"):
    _, raw = services.create_join_token(region)
    body = {
        "join_token": raw,
        "hostname": hostname,
        "address": address,
        "region": region.code,
        "inventory": make_inventory(hostname, 1),
    }
    return raw, post_json(Client(), "/agent/v1/register", body)


@pytest.mark.parametrize("address", REFUSED)
def test_registration_at_a_forbidden_address_is_refused(region, a100, address):
    raw, response = register_at(region, address)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid_address"
    assert not Host.objects.exists()
    # The join token is not spent: the agent may register again with a good address.
    body = {
        "join_token": raw,
        "hostname": "host-x",
        "address": "http://10.0.0.9:9101",
        "inventory": make_inventory("host-x", 1),
    }
    assert post_json(Client(), "/agent/v1/register", body).status_code == 201


@pytest.mark.parametrize("address", ALLOWED)
def test_registration_at_an_allowed_address(region, a100, address):
    _, response = register_at(region, address)
    assert response.status_code == 201, response.content
    assert Host.objects.get().address == address.rstrip("/")


def test_every_address_a_name_resolves_to_must_be_allowed(region, a100):
    _, response = register_at(region, "http://sneaky:9101")
    assert response.status_code == 400
    assert "169.254.169.254" in response.json()["detail"]


def test_an_operator_chooses_the_networks_but_never_metadata(region, a100, settings):
    settings.AGENT_ALLOWED_NETWORKS = [ipaddress.ip_network("0.0.0.0/0")]
    _, response = register_at(region, "http://8.8.8.8:9101")
    assert response.status_code == 201
    for n, address in enumerate(("http://169.254.169.254/", "http://100.100.100.200/")):
        _, response = register_at(region, address, hostname=f"host-{n}")
        assert response.status_code == 400, address
    settings.AGENT_ALLOWED_NETWORKS = [ipaddress.ip_network("10.20.0.0/16")]
    _, response = register_at(region, "http://127.0.0.1:9101", hostname="host-local")
    assert response.status_code == 400
    assert "outside AGENT_ALLOWED_NETWORKS" in response.json()["detail"]


@pytest.mark.parametrize(
    "address", ["http://169.254.169.254/", "http://8.8.8.8:9101", "http://10.0.0.4:9200"]
)
def test_a_heartbeat_never_moves_the_host(register, address):
    """Whatever it says (tests/security/test_host_identity.py: what a thief would make of it)."""
    host, secret = register()
    body = {"host_id": host.pk, "inventory_digest": host.inventory_digest, "address": address}
    response = post_json(agent_client_for(secret), "/agent/v1/heartbeat", body)
    assert response.status_code == 200, response.content
    host.refresh_from_db()
    assert host.address == "http://127.0.0.1:9101"
    assert host.reported_address == address.rstrip("/")


def test_a_bad_network_in_the_setting_fails_at_startup(monkeypatch):
    monkeypatch.setenv("AGENT_ALLOWED_NETWORKS", "10.0.0.0/8, not-a-network")
    with pytest.raises(ImproperlyConfigured, match="not-a-network"):
        env_networks("AGENT_ALLOWED_NETWORKS", "")
    monkeypatch.setenv("AGENT_ALLOWED_NETWORKS", "10.0.0.0/8, 192.0.2.7")
    assert env_networks("AGENT_ALLOWED_NETWORKS", "") == [
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("192.0.2.7/32"),
    ]
