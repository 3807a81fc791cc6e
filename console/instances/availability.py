"""Whether a tenant can launch a spec in a region, and what happens if it does.

    fits_now     a slice is free now: it starts provisioning at once
    queues       the region has the hardware, but it is busy: it waits in the queue
    no_hardware  no host in the region has GPUs of its model and mode (or enough of them on
                 one host), or those that have them lack its vCPUs or RAM (the detail names
                 them): it could never be placed, so it is not offered
    over_quota   it alone needs more than the tenant's quota: it could never start

The launch form, the resize list, the API (GET /api/v1/specs/?region=) and the CLI all
answer with `classify`; a `Checker` reads the region once for many specs."""

from dataclasses import dataclass
from decimal import Decimal

from accounts.models import Quota
from console.catalog.models import Region, Spec
from console.fleet.models import Host
from console.instances import placement
from console.instances.reasons import format_mib

FITS_NOW = "fits_now"
QUEUES = "queues"
NO_HARDWARE = "no_hardware"
OVER_QUOTA = "over_quota"
STATUSES = (FITS_NOW, QUEUES, NO_HARDWARE, OVER_QUOTA)
LABELS = {
    FITS_NOW: "fits now",
    QUEUES: "queues",
    NO_HARDWARE: "no hardware here",
    OVER_QUOTA: "over your quota",
}


@dataclass(frozen=True)
class Availability:
    status: str
    detail: str

    @property
    def launchable(self) -> bool:
        return self.status in (FITS_NOW, QUEUES)

    @property
    def label(self) -> str:
        return LABELS[self.status]


def _num(value: Decimal) -> str:
    return f"{value.normalize():f}"


def hardware_detail(
    spec: Spec,
    region: Region,
    host: Host | None = None,
    hardware: placement.Snapshot | None = None,
) -> str:
    """Why `spec` can never be placed in `region` (on `host`, which holds a disk): no host has
    its GPUs, or the hosts that have them are short of vCPUs or RAM (each named, with what it
    has and what the spec asks). `hardware` is the region as placement.snapshot(empty=True)
    sees it, when the caller has it already."""
    if hardware is None:
        hardware = placement.snapshot(region.pk, host_pks=[host.pk] if host else None, empty=True)
    count = spec.gpu_count if spec.mode == "whole" and spec.gpu_count > 1 else 1
    gpus = f"{count}× {spec.gpu_model.name}" if count > 1 else spec.gpu_model.name
    mode = spec.get_mode_display().lower()
    short = placement.shortfalls(spec, hardware)
    if short:
        hosts = "; ".join(f"{s.host} has {'them' if i else 'the GPUs'} but {_lacks(s)}"
                          for i, s in enumerate(short))  # fmt: skip
        return f"{spec.name} asks {_asks(spec, short)}: {hosts}."
    where = f"No host in {region.name} has"
    if host is not None:
        where = f"{host.name}, which holds its disk, has no"
    return f"{where} {gpus} GPUs in {mode} mode that could hold {spec.name}."


def _asks(spec: Spec, short: list[placement.Shortfall]) -> str:
    asked = []
    if any(s.vcpus for s in short):
        asked.append(f"{spec.vcpus} vCPUs")
    if any(s.ram_mib for s in short):
        asked.append(f"{format_mib(spec.ram_mib)} of RAM")
    return " and ".join(asked)


def _lacks(short: placement.Shortfall) -> str:
    lacks = []
    if short.vcpus:
        lacks.append(f"only {short.vcpus[0]} vCPUs")
    if short.ram_mib:
        lacks.append(f"only {format_mib(short.ram_mib[0])} of RAM")
    return " and ".join(lacks)


def quota_detail(spec: Spec, quota: Quota) -> str:
    """Why the tenant of `quota` could never start `spec` whatever the hardware ("" when its
    quota allows one)."""
    wanted = spec.gpu_equivalents
    if wanted > quota.gpu_quota:
        return f"{spec.name} needs {_num(wanted)} GPU; your quota is {_num(quota.gpu_quota)} GPU."
    if quota.max_instances < 1:
        return "Your quota allows no instances."
    return ""


def classify(
    spec: Spec,
    region: Region,
    quota: Quota,
    *,
    hardware: placement.Snapshot,
    now: placement.Snapshot,
) -> Availability:
    """What launching `spec` in `region` does for the tenant of `quota`: `hardware` is the
    region as placement.snapshot(empty=True) sees it, `now` as placement.snapshot does."""
    over_quota = quota_detail(spec, quota)
    if not placement.fits_now(spec, hardware):
        detail = hardware_detail(spec, region, hardware=hardware)
        return Availability(NO_HARDWARE, f"{detail} {over_quota}".strip())
    if over_quota:
        return Availability(OVER_QUOTA, over_quota)
    if placement.fits_now(spec, now):
        return Availability(FITS_NOW, f"A slice is free in {region.name} now.")
    return Availability(
        QUEUES, f"{region.name} has the hardware, but it is busy: it waits for a free slice."
    )


class Checker:
    """`classify` for many specs of one tenant in one region, reading the region once."""

    def __init__(self, quota: Quota, region: Region):
        self.quota = quota
        self.region = region
        self.hardware = placement.snapshot(region.pk, empty=True)
        self.now = placement.snapshot(region.pk)

    def of(self, spec: Spec) -> Availability:
        return classify(spec, self.region, self.quota, hardware=self.hardware, now=self.now)


def can_ever_place(spec: Spec, region: Region, host: Host | None = None) -> bool:
    """Whether some host of `region` (or `host`, which holds a disk) could hold `spec` if it
    were empty."""
    hardware = placement.snapshot(region.pk, host_pks=[host.pk] if host else None, empty=True)
    return placement.fits_now(spec, hardware)
