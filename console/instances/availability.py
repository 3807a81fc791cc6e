"""Whether a tenant can launch a spec in a region, and what happens if it does.

    fits_now     a slice is free now: it starts provisioning at once
    queues       the region has the hardware, but it is busy: it waits in the queue
    no_hardware  no host in the region has GPUs of its model and mode (or enough of them on
                 one host): it could never be placed, so it is not offered
    over_quota   it alone needs more than the tenant's quota: it could never start

The launch form, the resize list, the API (GET /api/v1/specs/?region=) and the CLI all
answer with `classify`; a `Checker` reads the region once for many specs."""

from dataclasses import dataclass
from decimal import Decimal

from accounts.models import Quota
from console.catalog.models import Region, Spec
from console.fleet.models import Host
from console.instances import placement

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


def hardware_detail(spec: Spec, region: Region, host: Host | None = None) -> str:
    """Why `spec` can never be placed in `region` (on `host`, which holds a disk)."""
    gpus = f"{spec.gpu_count}× " if spec.mode == "whole" and spec.gpu_count > 1 else ""
    where = f"No host in {region.name} has"
    if host is not None:
        where = f"{host.name}, which holds its disk, has no"
    return (
        f"{where} {gpus}{spec.gpu_model.name} GPUs in {spec.get_mode_display().lower()} mode "
        f"that could hold {spec.name}."
    )


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
    if not placement.fits_now(spec, hardware):
        return Availability(NO_HARDWARE, hardware_detail(spec, region))
    wanted = spec.gpu_equivalents
    if wanted > quota.gpu_quota:
        return Availability(
            OVER_QUOTA,
            f"{spec.name} needs {_num(wanted)} GPU; your quota is {_num(quota.gpu_quota)} GPU.",
        )
    if quota.max_instances < 1:
        return Availability(OVER_QUOTA, "Your quota allows no instances.")
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
