"""What a container may connect to, enforced by nftables on the host.

Each install of the agent owns two base chains in `table inet gpucloud` (`input_<install>`,
`forward_<install>`), rewritten whole in one nft transaction whenever its set of tenant
bridges changes. For each bridge:

- input: nothing from the bridge opens a connection to the host itself, on any of its
  addresses (agent API, SSH gateway, console, database, Redis...), except DNS to the bridge's
  own gateway (Podman's aardvark-dns); replies to what the host opened (the port proxy) pass;
- forward: nothing forwarded opens a connection into the bridge (another tenant's network,
  the engine's default bridge, another interface of the host); what leaves the bridge never
  goes to a link-local address (cloud metadata), and with `egress` "public" never to private
  networks either, with "none" nowhere.

Traffic between the containers of one bridge (one tenant) stays on the bridge and is not
forwarded. Needs root and the `nft` command.
"""

import subprocess

TABLE = "inet gpucloud"
EGRESS = ("all", "public", "none")
LINK_LOCAL = "ip daddr 169.254.0.0/16 drop", "ip6 daddr fe80::/10 drop"
PRIVATE = (
    "ip daddr { 10.0.0.0/8, 100.64.0.0/10, 169.254.0.0/16, 172.16.0.0/12, 192.168.0.0/16 } drop",
    "ip6 daddr { fc00::/7, fe80::/10 } drop",
)


class FirewallError(Exception):
    pass


def _chains(install: str) -> dict[str, str]:
    return {f"input_{install}": "input", f"forward_{install}": "forward"}


def _rules(bridge: str, egress: str) -> dict[str, list[str]]:
    leaving = f'iifname "{bridge}" oifname != "{bridge}"'
    outbound = {"all": LINK_LOCAL, "public": PRIVATE, "none": ("drop",)}[egress]
    return {
        "input": [
            f'iifname "{bridge}" meta l4proto {{ tcp, udp }} th dport 53 '
            "fib daddr . iif type local accept",
            f'iifname "{bridge}" ct state != {{ established, related }} drop',
        ],
        "forward": [
            f'oifname "{bridge}" iifname != "{bridge}" ct state != {{ established, related }} drop',
            *(f"{leaving} {rule}" for rule in outbound),
        ],
    }


def script(install: str, bridges: list[str], egress: str) -> str:
    """The nft script that makes the install's chains hold exactly the rules of `bridges`
    (none: the chains go)."""
    lines = [f"add table {TABLE}"]
    for chain, hook in _chains(install).items():
        base = f"type filter hook {hook} priority filter; policy accept;"
        lines.append(f"add chain {TABLE} {chain} {{ {base} }}")
        lines.append(f"flush chain {TABLE} {chain}")
        if not bridges:
            lines.append(f"delete chain {TABLE} {chain}")
        for bridge in bridges:
            lines.extend(
                f"add rule {TABLE} {chain} {rule}" for rule in _rules(bridge, egress)[hook]
            )
    return "\n".join(lines) + "\n"


def apply(install: str, bridges: list[str], egress: str) -> None:
    """Install the rules for `bridges` (replacing the install's earlier ones), atomically."""
    try:
        done = subprocess.run(
            ["nft", "-f", "-"],
            input=script(install, bridges, egress),
            capture_output=True,
            text=True,
        )
    except OSError as exc:
        raise FirewallError(f"cannot run nft: {exc}") from exc
    if done.returncode != 0:
        raise FirewallError(f"nft refused the rules: {done.stderr.strip()}")


def remove(install: str) -> None:
    """Remove the install's chains (its networks are gone)."""
    apply(install, [], "all")


def check() -> tuple[str, bool]:
    """Whether this user can read and change the host's nftables (`nft list tables`, which
    changes nothing), in words, for `gpucloud-agent probe`; and whether it can."""
    try:
        version = subprocess.run(["nft", "--version"], capture_output=True, text=True)
        listed = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
    except OSError as exc:
        return (
            f"nft cannot be run ({exc}): the agent needs it to confine containers' traffic",
            False,
        )
    said = version.stdout.strip() or "nft"
    if listed.returncode != 0:
        why = listed.stderr.strip().splitlines()[-1:] or ["refused"]
        return f"{said}, but `nft list tables` fails ({why[0]}): the agent needs root", False
    mine = [line for line in listed.stdout.splitlines() if line.strip() == f"table {TABLE}"]
    state = "the agent's table is there" if mine else "the agent's table is not there yet"
    return f"{said}; usable ({state})", True
