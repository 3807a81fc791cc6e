"""A tenant's webhook never reaches the operator's own network: loopback, private,
link-local (cloud metadata) and IPv6 loopback addresses are refused in production settings,
IPv6 forms that reach IPv4 space (compatible, mapped, translated, NAT64, 6to4, Teredo) are
judged as the IPv4 addresses they embed,
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
    "https://[::127.0.0.1]/hook",  # IPv4-compatible
    "https://[::10.0.0.5]/hook",
    "https://[::169.254.169.254]/hook",
    "https://[::ffff:10.0.0.5]/hook",  # IPv4-mapped
    "https://[::ffff:0:10.0.0.5]/hook",  # IPv4-translated (SIIT)
    "https://[64:ff9b::10.0.0.5]/hook",  # NAT64
    "https://[64:ff9b::a9fe:a9fe]/hook",  # NAT64 of 169.254.169.254
    "https://[64:ff9b::127.0.0.1]/hook",
    "https://[64:ff9b:1::5db8:d822]/hook",  # NAT64 local use: the operator's translator
    "https://[2002:a00:5::1]/hook",  # 6to4 of 10.0.0.5
    "https://[2002:7f00:1::]/hook",  # 6to4 of 127.0.0.1
    "https://[2001:0:a00:5:8000:63bf:a247:27dd]/hook",  # Teredo, server 10.0.0.5
    "https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/hook",  # Teredo, client 192.0.2.45
    "https://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/hook",  # Teredo, client 10.0.0.1
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


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.0.0.7", "169.254.169.254", "::1", "::10.0.0.7", "64:ff9b::a9fe:a9fe"],
)
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


@pytest.mark.parametrize(
    ("address", "embedded"),
    [
        ("::93.184.216.34", "93.184.216.34"),
        ("::ffff:93.184.216.34", "93.184.216.34"),
        ("64:ff9b::93.184.216.34", "93.184.216.34"),
        ("2002:5db8:d822::1", "93.184.216.34"),
        ("2001:0:4136:e378:8000:63bf:a247:27dd", "93.184.216.34"),
    ],
)
def test_an_ipv6_form_of_a_public_ipv4_address_is_judged_as_that_address(
    production, address, embedded
):
    """NAT64 is how an IPv6-only console reaches IPv4-only receivers (DNS64 answers these), and
    a relay sends 6to4 and Teredo to the address they embed: a public one may be reached."""
    assert outbound.address_refusal(embedded) is None
    assert outbound.address_refusal(address) is None


EMBEDDED_LINK_LOCAL = ["::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "::ffff:0.0.0.0"]


@pytest.mark.parametrize("address", EMBEDDED_LINK_LOCAL)
def test_embedded_link_local_stays_refused_where_private_addresses_are_allowed(settings, address):
    settings.NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES = True
    assert outbound.address_refusal(address)


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
