"""IPv6 addresses that reach IPv4 space, judged as the IPv4 addresses they embed.

A connection to one of these forms lands on (or is relayed to) an IPv4 address written inside
it, so a check that judged the IPv6 address itself would let `::10.0.0.5` or
`64:ff9b::a9fe:a9fe` (169.254.169.254) through. Every check of where the console may connect
judges what `judged_as()` returns instead:

- IPv4-mapped `::ffff:0:0/96`, IPv4-translated `::ffff:0:0:0/96` (SIIT) and IPv4-compatible
  `::/96` (`::` and `::1` aside, IPv6's own unspecified and loopback): the same host;
- NAT64's well-known prefix `64:ff9b::/96` (RFC 6052): the translator connects to the last
  32 bits;
- 6to4 `2002::/16`: bits 16 to 48, where the relay sends the packet;
- Teredo `2001::/32`: its server and its (obfuscated) client address, both judged."""

import ipaddress

IP = ipaddress.IPv4Address | ipaddress.IPv6Address

COMPATIBLE = ipaddress.IPv6Network("::/96")
TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
IPV6_ITSELF = (ipaddress.IPv6Address("::"), ipaddress.IPv6Address("::1"))


def _low32(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)


def judged_as(ip: IP) -> tuple[IP, ...]:
    """The addresses a connection to `ip` reaches: the IPv4 addresses it embeds, or itself."""
    if ip.version == 4:
        return (ip,)
    if ip.ipv4_mapped:
        return (ip.ipv4_mapped,)
    if ip.teredo:
        return ip.teredo
    if ip.sixtofour:
        return (ip.sixtofour,)
    if ip in IPV6_ITSELF:
        return (ip,)
    if ip in COMPATIBLE or ip in TRANSLATED or ip in NAT64:
        return (_low32(ip),)
    return (ip,)
