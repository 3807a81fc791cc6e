"""Where an image can come from in a region, before anyone launches it.

    held         hosts of the region hold it (their agents' inventories), or run workloads
                 without images (the sim and process runtimes: nothing to pull); the size
                 is what the engines report
    mirror       no host holds it; the region's registry mirror serves it, and a host
                 reaches the mirror (or none has said yet)
    registry     no host holds it; it comes from its own registry, which a host reaches (or
                 which no host has checked yet: a tenant's own registry, a new image)
    unreachable  no host holds it, and every host that checked says it cannot reach its
                 registry (nor the mirror): the error they gave
    not_built    a `localhost/` image no host holds: it is built on a host, never pulled

The agents check the registries the console names (agent/registry_probe.py); their answers
are each host's `registry_checks`. The launch form, the API (GET /api/v1/images/?region=), the
CLI and the launch itself (which refuses the last two) all answer with `Fleet.of`, which takes
any reference: a catalog image's or a tenant's own.
"""

from dataclasses import dataclass

from console.catalog.models import Region
from console.fleet.images import human_size, normalize, registry_of
from console.fleet.models import Host, HostImage

HELD = "held"
MIRROR = "mirror"
REGISTRY = "registry"
UNREACHABLE = "unreachable"
NOT_BUILT = "not_built"
STATUSES = (HELD, MIRROR, REGISTRY, UNREACHABLE, NOT_BUILT)
LABELS = {
    HELD: "on hosts",
    MIRROR: "via mirror",
    REGISTRY: "pullable",
    UNREACHABLE: "registry unreachable",
    NOT_BUILT: "not built",
}
# hosts whose reports say nothing of where a launch can go now
SILENT = (Host.Status.RETIRED, Host.Status.UNREACHABLE)
NAMED = 3  # hosts named in a detail, at most


@dataclass(frozen=True)
class ImageAvailability:
    status: str
    detail: str
    size_bytes: int | None = None  # known where a host holds it
    hosts: tuple[str, ...] = ()  # the hosts that can start it without a pull

    @property
    def launchable(self) -> bool:
        return self.status not in (UNREACHABLE, NOT_BUILT)

    @property
    def label(self) -> str:
        return LABELS[self.status]

    @property
    def size(self) -> str:
        return human_size(self.size_bytes) if self.size_bytes else ""

    def as_dict(self) -> dict:
        return {
            "status": self.status,
            "launchable": self.launchable,
            "detail": self.detail,
            "size_bytes": self.size_bytes,
            "hosts": list(self.hosts),
        }


def _names(names) -> str:
    names = sorted(names)
    return ", ".join(names[:NAMED]) + (
        f" and {len(names) - NAMED} more" if len(names) > NAMED else ""
    )


class Fleet:
    """A region's hosts as image availability reads them, read once for many references."""

    def __init__(self, region: Region):
        self.region = region
        hosts = list(
            Host.objects.filter(region=region)
            .exclude(status__in=SILENT)
            .only("name", "image_settings", "registry_checks")
            .order_by("name")
        )
        self.names = {host.pk: host.name for host in hosts}
        # hosts whose runtime holds no images run any reference (console/instances/pulls.py)
        self.imageless = [host.name for host in hosts if not host.image_settings]
        self.oci = [host for host in hosts if host.image_settings]
        self._held: dict[str, dict[int, int]] | None = None

    def held(self, reference: str) -> dict[int, int]:
        """host pk → the image's size, for the hosts that hold `reference`."""
        if self._held is None:
            self._held = {}
            rows = HostImage.objects.filter(host_id__in=[host.pk for host in self.oci])
            for host_pk, ref, size in rows.values_list("host_id", "reference", "size_bytes"):
                self._held.setdefault(ref, {})[host_pk] = size
        return self._held.get(normalize(reference), {})

    def reach(self, registry: str) -> tuple[list[str], list[str], list[str]]:
        """(hosts that reach `registry`, errors of those that do not, hosts that have not
        checked it)."""
        reached, errors, unchecked = [], [], []
        for host in self.oci:
            found = next((c for c in host.registry_checks if c["registry"] == registry), None)
            if found is None:
                unchecked.append(host.name)
            elif found["reachable"]:
                reached.append(host.name)
            else:
                errors.append(
                    f"{host.name}: {found['error']}" if len(self.oci) > 1 else found["error"]
                )
        return reached, errors, unchecked

    def of(self, reference: str) -> ImageAvailability:
        """Where `reference` can come from in the region (see the module's docstring)."""
        region = self.region.name
        held = self.held(reference)
        holders = [self.names[pk] for pk in held]
        size = max(held.values(), default=0) or None
        if holders:
            size_text = f" ({human_size(size)})" if size else ""
            count = len(holders)
            detail = f"Held by {count} host{'s' if count > 1 else ''} of {region}{size_text}: "
            return ImageAvailability(
                HELD, detail + f"{_names(holders)}.", size, (*holders, *self.imageless)
            )
        if self.imageless:
            return ImageAvailability(
                HELD,
                f"The hosts of {region} run workloads without images ({_names(self.imageless)}): "
                "nothing to pull.",
                None,
                tuple(self.imageless),
            )
        registry = registry_of(reference)
        if registry == "localhost":
            return ImageAvailability(
                NOT_BUILT,
                f"{reference} is built on a host, never pulled, and no host of {region} holds "
                "it: the operator builds it there (make images).",
            )
        if not self.oci:
            return ImageAvailability(
                REGISTRY, f"Pulled from {registry}; {region} has no host to check it yet."
            )
        mirror = self._mirror(reference)
        if mirror is not None:
            reached, mirror_errors, unchecked = self.reach(mirror)
            if reached or unchecked:
                checked = "" if reached else " (no host has checked the mirror yet)"
                return ImageAvailability(
                    MIRROR,
                    f"Pulled through {region}'s registry mirror {mirror}{checked}; no host "
                    "holds it yet.",
                )
        reached, errors, unchecked = self.reach(registry)
        if reached:
            return ImageAvailability(
                REGISTRY,
                f"Pulled from {registry} (reached by {_names(reached)}); no host holds it yet.",
            )
        if unchecked:
            return ImageAvailability(
                REGISTRY,
                f"Pulled from {registry}, which no host of {region} has checked yet: the pull "
                "will tell.",
            )
        detail = f"No host of {region} can reach {registry} ({'; '.join(errors)})"
        if mirror is not None:
            detail += f", nor the registry mirror {mirror} ({'; '.join(mirror_errors)})"
        return ImageAvailability(
            UNREACHABLE,
            f"{detail}: the operator gives the region a mirror that serves it, or lets the "
            "hosts reach the registry.",
        )

    def _mirror(self, reference: str) -> str | None:
        """The region's mirror, where it serves `reference` (as agent/image_store.py's
        `mirrored`: not an image of the mirror itself, nor one named by digest)."""
        mirror = self.region.registry_mirror
        if not mirror or "@" in reference or registry_of(reference) in (mirror, "localhost"):
            return None
        return mirror


def classify(region: Region, reference: str) -> ImageAvailability:
    """Where `reference` can come from in `region` (a Fleet for one reference)."""
    return Fleet(region).of(reference)
