"""One engine network per tenant: a tenant's containers reach each other and no one else's.

The network of tenant T is a bridge network named `gpucloud-<install>-<digest>`, with the
bridge interface `gpc<digest>` (the digest is of the install id and T: no two installs on a
host share a name or a bridge), labelled `gpucloud.install` and `gpucloud.tenant`, created on
the tenant's first launch and kept for its next ones. agent/firewall.py keeps the install's
nftables rules in step with its bridges: set up at start for the networks found by label, and
again whenever a network is added, before any container is on it.

The subnets of these networks (and of the engine's default one) go to the console with the
inventory (`container_networks`): no host may have an address in one, so that a tenant's
container can never be taken for a host (console/fleet/addresses.py).
"""

import hashlib
import threading

from agent import firewall
from agent.runtimes import LaunchError

LABEL_INSTALL = "gpucloud.install"
LABEL_TENANT = "gpucloud.tenant"
BRIDGE_OPTION = "com.docker.network.bridge.name"
DEFAULT_NETWORKS = ("bridge", "podman")  # Docker's default network, Podman's


def _subnets(network) -> set[str]:
    configs = ((network.attrs or {}).get("IPAM") or {}).get("Config") or []
    return {c["Subnet"] for c in configs if isinstance(c, dict) and c.get("Subnet")}


class TenantNetworks:
    def __init__(self, client, install: str, egress: str, *, podman: bool):
        """Set up the firewall for the networks this install already has (raises
        FirewallError when it cannot)."""
        self.client = client
        self.install = install
        self.egress = egress
        # netavark's own isolation between networks, on top of the firewall's
        self.options = {"isolate": "true"} if podman else {}
        found = client.networks.list(filters={"label": f"{LABEL_INSTALL}={install}"})
        self._bridges = {self._bridge(n.attrs["Labels"][LABEL_TENANT]) for n in found}
        defaults = [n for n in client.networks.list() if n.name in DEFAULT_NETWORKS]
        self.subnets = set().union(*map(_subnets, [*found, *defaults]))
        self._lock = threading.Lock()
        firewall.apply(install, sorted(self._bridges), egress)

    def _digest(self, tenant: str) -> str:
        return hashlib.sha256(f"{self.install}\0{tenant}".encode()).hexdigest()[:12]

    def _bridge(self, tenant: str) -> str:
        return f"gpc{self._digest(tenant)}"  # at most 15 characters, as Linux requires

    def name(self, tenant: str) -> str:
        return f"gpucloud-{self.install}-{self._digest(tenant)}"

    def release(self) -> bool:
        """Remove the install's firewall chains if no container runs on its networks (a clean
        stop that leaves nothing to guard); True when they went. Running containers outlive
        the agent, and these rules are what keep them from the host: theirs stay."""
        prefix = f"gpucloud-{self.install}-"
        for container in self.client.containers.list():
            networks = (container.attrs.get("NetworkSettings") or {}).get("Networks") or {}
            if any(name.startswith(prefix) for name in networks):
                return False
        with self._lock:
            firewall.remove(self.install)
            self._bridges.clear()
        return True

    def ensure(self, tenant: str) -> str:
        """The name of the tenant's network, created (and firewalled) if it is not there."""
        name, bridge = self.name(tenant), self._bridge(tenant)
        labels = {LABEL_INSTALL: self.install, LABEL_TENANT: tenant}
        with self._lock:
            wanted = [f"{key}={value}" for key, value in labels.items()]
            if not self.client.networks.list(filters={"label": wanted}):
                created = self.client.networks.create(
                    name,
                    driver="bridge",
                    labels=labels,
                    options={BRIDGE_OPTION: bridge, **self.options},
                )
                created.reload()  # the subnet the engine chose
                self.subnets |= _subnets(created)
            if bridge not in self._bridges:
                try:
                    firewall.apply(self.install, sorted(self._bridges | {bridge}), self.egress)
                except firewall.FirewallError as exc:
                    raise LaunchError(f"launch_failed: firewall: {exc}") from exc
                self._bridges.add(bridge)
        return name
