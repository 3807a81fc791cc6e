"""Whose instances hold the fleet's GPUs, and which instances wait for a host, for the
operators' pages. The fleet sits below the instances app (it may not import it): it reaches
their rows through its own relations (Gpu.claims, Host.disks), in a fixed number of queries."""

from django.db.models import Prefetch, Q

from console.catalog.models import Mode
from console.fleet.models import Gpu, Host

PENDING = "pending"  # console.instances.models.State.PENDING
# The waiting instances the fleet page lists (the count says how many more there are).
WAITING_SHOWN = 50


def claims() -> Prefetch:
    """The claims held on each GPU, with their instance and its tenant and spec (one query)."""
    claim = Gpu.claims.rel.related_model
    return Prefetch(
        "claims",
        queryset=claim.objects.filter(allocation__released_at__isnull=True)
        .select_related("allocation__instance__tenant", "allocation__instance__spec__mig_profile")
        .order_by("allocation__created_at", "slot", "pk"),
    )


def _share(gpu: Gpu, held: list) -> str:
    """What one allocation holds of the GPU: its thousandths, its MIG slices, or all of it."""
    if gpu.mode == Mode.SHARED:
        return f"{sum(claim.milli for claim in held)} milli"
    if gpu.mode == Mode.MIG:
        slots = sorted(claim.slot for claim in held if claim.slot is not None)
        profile = held[0].allocation.instance.spec.mig_profile
        name = f"{profile.name} " if profile else ""
        return f"{name}slices {slots[0]}–{slots[-1]}" if slots else name.strip()
    return "whole GPU"


def attach(host: Host) -> None:
    """Give each GPU of `host` (fetched with `claims()`) its holders: one entry per instance,
    in the order they came, with what it holds."""
    for gpu in host.gpus.all():
        by_allocation: dict[str, list] = {}
        for claim in gpu.claims.all():
            by_allocation.setdefault(claim.allocation_id, []).append(claim)
        gpu.holders = [
            {"instance": held[0].allocation.instance, "share": _share(gpu, held)}
            for held in by_allocation.values()
        ]


def waiting(host: Host | None = None) -> dict:
    """The pending instances, first to be placed first: all of them, or those that wait for
    `host` (its disk is there, or it has none yet and `host` has GPUs of its spec's model in its
    region). {"instances": the first WAITING_SHOWN, "count": all of them}."""
    instance = Host.disks.rel.related_model
    queue = instance.objects.filter(state=PENDING)
    if host is not None:
        models = {gpu.model_id for gpu in host.gpus.all()}
        queue = queue.filter(
            Q(disk_host=host)
            | Q(disk_host__isnull=True, region_id=host.region_id, spec__gpu_model_id__in=models)
        )
    shown = list(
        queue.select_related("tenant", "spec", "region", "disk_host").order_by(
            "-priority", "created_at", "pk"
        )[:WAITING_SHOWN]
    )
    count = len(shown) if len(shown) < WAITING_SHOWN else queue.count()
    return {"instances": shown, "count": count}
