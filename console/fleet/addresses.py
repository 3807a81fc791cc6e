"""Where the console may call a host agent.

An agent says where its API is (its base URL) when it registers and when it moves. The console
then calls that address with the host's secret, on behalf of tenants (their instances, their
terminals, their ports): an address it must not call would make it a proxy into whatever that
address reaches. So an agent's address must resolve only to addresses in
settings.AGENT_ALLOWED_NETWORKS (by default loopback and the private ranges), and never to a
link-local address (where clouds serve instance metadata and credentials) or another cloud
metadata address, whatever that setting says."""

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings

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


def address_problem(address: str) -> str | None:
    """Why the console may not call an agent at `address`, or None when it may."""
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
    for ip in sorted(ips, key=str):
        ip = getattr(ip, "ipv4_mapped", None) or ip
        if _never(ip):
            return f"{parts.hostname} is {ip}, a link-local or cloud metadata address"
        if not any(ip in network for network in settings.AGENT_ALLOWED_NETWORKS):
            return f"{parts.hostname} is {ip}, outside AGENT_ALLOWED_NETWORKS"
    return None
