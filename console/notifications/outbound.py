"""The one way notifications reach the outside: a POST to a tenant's URL that never lands on
the operator's own network.

Before each request the URL's host is resolved and every address it resolves to is checked:
loopback, private, shared, link-local (cloud metadata), multicast and reserved addresses are
refused, and the connection is made to the address that was checked (the URL's host still
names the TLS certificate and the Host header), so a name that resolves elsewhere a moment
later (DNS rebinding) gains nothing. Only https, no redirects, no proxies from the
environment. An IPv6 address that reaches IPv4 space (mapped, compatible, NAT64, 6to4, Teredo)
is judged as the IPv4 addresses it embeds (console.embedded_ipv4), and NAT64's local-use prefix,
whose embedding only the operator's network knows, is refused.

NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES lets loopback and private addresses, and plain http,
through: for tests and `make run`, never for a deployment. Link-local, multicast and
unspecified addresses stay refused even then."""

import ipaddress
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from console.embedded_ipv4 import IP, judged_as

EXCERPT_BYTES = 500
# Not global, though this Python's ipaddress does not say so: NAT64's local-use prefix
# (RFC 8215), translated by the operator's own network at a place the address does not say.
NOT_GLOBAL = (ipaddress.IPv6Network("64:ff9b:1::/48"),)
USER_AGENT = "gpucloud-notifications/1"


class AddressRefused(Exception):
    """The URL is not one notifications may reach; retrying will not change that."""


@dataclass(frozen=True)
class Response:
    status_code: int
    excerpt: str
    latency_ms: int


def allow_private() -> bool:
    return settings.NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES


def _refusal(ip: IP) -> str | None:
    if ip.is_link_local or ip.is_multicast or ip.is_unspecified:
        return f"{ip} is a link-local, multicast or unspecified address"
    if allow_private() or (ip.is_global and not any(ip in net for net in NOT_GLOBAL)):
        return None
    return f"{ip} is a loopback, private or reserved address"


def address_refusal(address: str) -> str | None:
    """Why `address` may not be reached, or None when it may."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    for reached in judged_as(ip):
        why = _refusal(reached)
        if why:
            return why if reached == ip else f"{ip} reaches IPv4 {why}"
    return None


def url_refusal(url: str) -> str | None:
    """What is wrong with `url` before any lookup: its scheme, its form, a literal address."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "not a valid URL"
    schemes = ("https", "http") if allow_private() else ("https",)
    if parts.scheme not in schemes:
        return "must be an https:// URL"
    if not parts.hostname:
        return "names no host"
    if parts.username is not None or parts.password is not None:
        return "must not carry a user name or password"
    if port == 0:
        return "names port 0"
    try:
        ipaddress.ip_address(parts.hostname.split("%", 1)[0])
    except ValueError:
        return None
    return address_refusal(parts.hostname)


def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, each checked; AddressRefused when any is refused."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise OSError(f"cannot resolve {host}: {exc}") from exc
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    for address in addresses:
        why = address_refusal(address)
        if why:
            raise AddressRefused(f"{host} resolves to {address}: {why}")
    if not addresses:
        raise OSError(f"{host} resolves to no address")
    return addresses


def post(url: str, body: bytes, headers: dict[str, str]) -> Response:
    """POST `body` to `url` through a checked, pinned address. AddressRefused for a URL or
    address it may not reach; httpx.HTTPError (or OSError) when the request fails on the way."""
    why = url_refusal(url)
    if why:
        raise AddressRefused(f"{url}: {why}")
    target = httpx.URL(url)
    port = target.port or (443 if target.scheme == "https" else 80)
    address = resolve(target.host, port)[0]
    pinned = target.copy_with(host=address)
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    sent = {
        **headers,
        "Host": target.netloc.decode("ascii"),
        "User-Agent": USER_AGENT,
        "Content-Type": "application/json",
    }
    timeout = settings.NOTIFICATIONS_TIMEOUT_SECONDS
    started = time.monotonic()
    with (
        httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client,
        client.stream("POST", pinned, content=body, headers=sent, extensions=extensions) as r,
    ):
        excerpt = b""
        for chunk in r.iter_bytes():
            excerpt += chunk
            if len(excerpt) >= EXCERPT_BYTES:
                break
    latency_ms = int((time.monotonic() - started) * 1000)
    text = excerpt[:EXCERPT_BYTES].decode("utf-8", errors="replace")
    return Response(r.status_code, text, latency_ms)
