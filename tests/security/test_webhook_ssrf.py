"""A tenant's webhook never reaches the operator's own network: loopback, private,
link-local (cloud metadata) and IPv6 loopback addresses are refused in production settings,
whether typed as an address or reached through a name that resolves to one (also when the name
resolves elsewhere at delivery time than when the endpoint was added), and the connection is
made to the address that was checked."""

import json
import socket

import pytest
from django.core.exceptions import ValidationError

from console.notifications import outbound, services
from console.notifications.models import Delivery, Endpoint

pytestmark = pytest.mark.django_db

KINDS = ["instance.failed"]
REFUSED_URLS = [
    "https://127.0.0.1/hook",
    "https://127.1.2.3:8443/hook",
    "https://10.0.0.5/hook",
    "https://172.16.3.4/hook",
    "https://192.168.1.1/hook",
    "https://169.254.169.254/latest/meta-data/",
    "https://[::1]/hook",
    "https://[::ffff:127.0.0.1]/hook",
    "https://[fd00::1]/hook",
    "https://100.64.0.1/hook",
    "https://0.0.0.0/hook",
    "https://localhost/hook",
    "http://hooks.example.com/hook",  # plain http
    "https://user:pw@hooks.example.com/hook",
]


@pytest.fixture
def production(settings):
    settings.NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES = False
    return settings


def resolving(monkeypatch, table: dict[str, list[str]]):
    """getaddrinfo answers `table`'s addresses for its names (and the real answer otherwise)."""
    real = socket.getaddrinfo

    def fake(host, port, *args, **kwargs):
        if host in table:
            return [
                (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port))
                for a in table[host]
            ]  # fmt: skip
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)


@pytest.mark.parametrize("url", REFUSED_URLS)
@pytest.mark.parametrize("channel", ["webhook", "slack"])
def test_private_targets_are_refused_when_added(tenant, production, url, channel):
    with pytest.raises(ValidationError) as refused:
        services.create_endpoint(tenant, name="x", channel=channel, target=url, kinds=KINDS)
    assert "target" in refused.value.message_dict
    assert not Endpoint.objects.exists()


def test_a_name_resolving_to_a_private_address_is_refused_when_added(
    tenant, production, monkeypatch
):
    resolving(monkeypatch, {"evil.example.com": ["93.184.216.34", "10.1.2.3"]})
    with pytest.raises(ValidationError) as refused:
        services.create_endpoint(
            tenant, name="x", channel="webhook", target="https://evil.example.com/", kinds=KINDS
        )
    assert "10.1.2.3" in str(refused.value.message_dict["target"])


@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.0.7", "169.254.169.254", "::1"])
def test_dns_rebinding_at_delivery_is_refused_and_never_connects(
    tenant, production, monkeypatch, address
):
    """Added while the name resolved to a public address; it resolves to a private one when
    the delivery goes: refused outright (no retry), and no connection is opened."""
    resolving(monkeypatch, {"rebind.example.com": ["93.184.216.34"]})
    services.create_endpoint(
        tenant, name="x", channel="webhook", target="https://rebind.example.com/", kinds=KINDS
    )
    resolving(monkeypatch, {"rebind.example.com": [address]})
    connects = []
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: connects.append(a))
    services.record_notice(tenant, "instance.failed", text="x")
    attempt = services.attempt_delivery(Delivery.objects.get().pk)
    assert not attempt.ok and attempt.error.startswith("refused:") and address in attempt.error
    assert Delivery.objects.get().state == "failed" and connects == []


def test_link_local_stays_refused_even_where_private_addresses_are_allowed(settings):
    settings.NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES = True
    assert outbound.address_refusal("127.0.0.1") is None
    assert outbound.address_refusal("169.254.169.254")
    assert outbound.address_refusal("fe80::1")
    assert outbound.address_refusal("0.0.0.0")


def test_the_connection_goes_to_the_address_that_was_checked(
    tenant, settings, monkeypatch, receiver
):
    """The name is resolved once and checked; the request goes to that address with the
    name in its Host header (here loopback, which the test setting allows)."""
    settings.NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES = True
    port = int(receiver.url.split(":")[2].split("/")[0])
    answers = iter([["127.0.0.1"], ["203.0.113.9"]])  # a second lookup would go elsewhere
    real = socket.getaddrinfo

    def once(host, port_, *args, **kwargs):
        if host == "hooks.tenant.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port_)) for a in next(answers)]
        return real(host, port_, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", once)
    outbound.post(f"http://hooks.tenant.test:{port}/hooks/gpucloud", json.dumps({}).encode(), {})
    [request] = receiver.requests
    assert request.headers["Host"] == f"hooks.tenant.test:{port}"


def test_redirects_are_not_followed(tenant, settings, receiver):
    settings.NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES = True
    receiver.statuses = [302]
    answer = outbound.post(receiver.url, b"{}", {})
    assert answer.status_code == 302 and len(receiver.requests) == 1
