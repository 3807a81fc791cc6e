"""Where the console may call a host agent.

An agent says where its API is (its base URL) when it joins; only the operator or a new join
changes it. The console then calls that address with the host's secret, on behalf of tenants
(their instances, their terminals, their ports, their snapshots): an address it must not call
would make it a proxy into whatever that address reaches, or hand a host's work (and its
credentials) to whoever listens there. So an agent's address must resolve only to addresses in
settings.AGENT_ALLOWED_NETWORKS (by default loopback and the private ranges), and never to

- a link-local address (where clouds serve instance metadata and credentials) or another cloud
  metadata address;
- an address inside a network the agents make for containers (the subnets every host reports,
  and settings.AGENT_REFUSED_NETWORKS): a tenant's container is never a host;
- loopback, unless the agent is on the console's own machine (its registration came from
  loopback, or the host was there already);

whatever AGENT_ALLOWED_NETWORKS says."""

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings

from console.embedded_ipv4 import judged_as
from console.fleet.models import Host

IP = ipaddress.IPv4Address | ipaddress.IPv6Address

# Cloud metadata services outside the link-local ranges (AWS over IPv6, Alibaba Cloud).
METADATA = (ipaddress.ip_network("fd00:ec2::254/128"), ipaddress.ip_network("100.100.100.200/32"))


def _never(ip: IP) -> bool:
    return (
        ip.is_link_local
        or ip.is_multicast
        or ip.is_unspecified
        or any(ip in network for network in METADATA)
    )


def _resolve(hostname: str) -> set[IP]:
    try:
        return {ipaddress.ip_address(hostname)}
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(hostname, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return set()
    return {ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}


def _network(text) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(text, strict=False)
    except (TypeError, ValueError):
        return None


def container_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Every subnet an agent reported for its containers, and AGENT_REFUSED_NETWORKS."""
    reported = {
        network
        for subnets in Host.objects.exclude(container_networks=[]).values_list(
            "container_networks", flat=True
        )
        for network in map(_network, subnets if isinstance(subnets, list) else [])
        if network is not None
    }
    return [*settings.AGENT_REFUSED_NETWORKS, *sorted(reported, key=str)]


def address_problem(address: str, *, local: bool) -> str | None:
    """Why the console may not call an agent at `address`, or None when it may. `local`: the
    agent is on the console's machine (a loopback address is its own)."""
    try:
        parts = urlsplit(address)
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError:
        return "must be the agent's http(s) base URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be the agent's http(s) base URL"
    ips = _resolve(parts.hostname)
    if not ips:
        return f"{parts.hostname} does not resolve"
    containers = container_networks()
    # an IPv6 form of an IPv4 address (mapped, NAT64, 6to4, Teredo …) is judged as the IPv4
    # address it reaches
    for ip in sorted({reached for given in ips for reached in judged_as(given)}, key=str):
        if _never(ip):
            return f"{parts.hostname} is {ip}, a link-local or cloud metadata address"
        inside = next((n for n in containers if n.version == ip.version and ip in n), None)
        if inside is not None:
            return f"{parts.hostname} is {ip}, inside {inside}, a network of containers"
        if ip.is_loopback and not local:
            return f"{parts.hostname} is {ip}, loopback, but the agent is not on this machine"
        if not any(ip in network for network in settings.AGENT_ALLOWED_NETWORKS):
            return f"{parts.hostname} is {ip}, outside AGENT_ALLOWED_NETWORKS"
    return None


def is_loopback(address: str) -> bool:
    """Whether `address` (an IP as the request's REMOTE_ADDR gives it) is this machine's."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    return all(reached.is_loopback for reached in judged_as(ip))


def url_is_loopback(address: str) -> bool:
    """Whether an agent's base URL names a loopback address (its name resolved)."""
    try:
        hostname = urlsplit(address).hostname
    except ValueError:
        return False
    ips = _resolve(hostname) if hostname else set()
    return bool(ips) and all(reached.is_loopback for ip in ips for reached in judged_as(ip))
