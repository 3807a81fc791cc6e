"""Which hosts could hold a spec, region by region, as placement sees them when empty (first
fit on the scheduler's model: GPU model, mode, MIG profile or count, vCPUs and RAM), and the
hosts whose vCPUs or RAM run out before their GPUs when they are filled with it. The operator
is told when a spec is added or changed: a spec no host can hold is offered to no tenant.

Hosts are read through the catalog's relations (Region.hosts, their GPUs), as
compatibility.py does: the fleet sits above the catalog."""

from dataclasses import dataclass, field, replace

from console.catalog.models import Mode, Region, Spec
from console.scheduler import model as core
from console.scheduler.cluster import Cluster
from console.scheduler.policies import place

RETIRED = "retired"  # console.fleet.models.Host.Status.RETIRED
UNLIMITED = 10**9  # a host that reports no vCPU/RAM figure is not limited by it
MAX_COUNTED = 512  # instances counted on one host when comparing its GPUs with its vCPUs


def request_for(spec: Spec) -> core.Request:
    """What placement needs to know of a spec."""
    common = {
        "models": frozenset([spec.gpu_model.code]),
        "cpu_milli": spec.vcpus * 1000,
        "ram_mib": spec.ram_mib,
    }
    if spec.mode == Mode.MIG:
        profile = spec.mig_profile
        mig = core.MigProfile(profile.name, profile.size, tuple(profile.starts))
        return core.Request(core.MIG, mig_profile=mig, **common)
    if spec.mode == Mode.SHARED:
        return core.Request(
            core.SHARED, milli=spec.milli, gpu_memory_mib=spec.gpu_memory_mib, **common
        )
    return core.Request(core.WHOLE, gpu_count=spec.gpu_count, **common)


def mib(value: int) -> str:
    """512 MiB, 32 GiB, 1.5 TiB."""
    for unit, size in (("TiB", 1024 * 1024), ("GiB", 1024)):
        if value >= size:
            return f"{value / size:.4g} {unit}"
    return f"{value} MiB"


@dataclass
class RegionFit:
    region: str
    holds: list[str] = field(default_factory=list)  # hosts that could hold one
    reason: str = ""  # why none does, when none does
    has_model: bool = False  # some host has GPUs of the spec's model (any mode)
    thin: list[str] = field(default_factory=list)  # hosts short of vCPU/RAM for their GPUs


@dataclass
class SpecFit:
    regions: list[RegionFit]

    def warning(self) -> str | None:
        """What the operator should know before tenants launch it; None when nothing."""
        if not self.regions:
            return "No host is registered yet: no tenant can launch it until one is."
        problems = [
            fit.reason for fit in self.regions if not fit.holds and (fit.has_model or not any(
                other.holds for other in self.regions
            ))
        ]  # fmt: skip
        problems += [thin for fit in self.regions for thin in fit.thin]
        if not problems:
            return None
        if not any(fit.holds for fit in self.regions):
            return "No host can hold it, so no tenant can launch it. " + " ".join(problems)
        return " ".join(problems)

    def summary(self) -> str:
        if not self.regions:
            return "No host is registered yet."
        parts = [
            f"{fit.region}: {', '.join(fit.holds)}." if fit.holds else fit.reason
            for fit in self.regions
        ]
        parts += [thin for fit in self.regions for thin in fit.thin]
        return " ".join(parts)


def spec_fit(spec: Spec) -> SpecFit:
    """Which hosts in service of each region could hold `spec` if they were empty."""
    request = request_for(spec)
    fits = []
    for region, nodes, names in _regions():
        fit = RegionFit(region)
        fit.has_model = any(g.model == spec.gpu_model.code for n in nodes for g in n.gpus)
        for node in nodes:
            if place(request, [node], "first-fit") is not None:
                fit.holds.append(names[node.id])
                if thin := _thin(spec, request, node, names[node.id]):
                    fit.thin.append(thin)
        if not fit.holds:
            fit.reason = _why_not(spec, request, region, nodes, names)
        fits.append(fit)
    return SpecFit(fits)


def _regions() -> list[tuple[str, list[core.Node], dict[int, str]]]:
    """Each region with hosts in service: its hosts as empty scheduler nodes, and their names."""
    rows = (
        Region.objects.filter(hosts__isnull=False)
        .values_list(
            "name",
            "hosts__pk",
            "hosts__name",
            "hosts__status",
            "hosts__vcpus",
            "hosts__ram_mib",
            "hosts__gpus__index",
            "hosts__gpus__model__code",
            "hosts__gpus__mode",
            "hosts__gpus__memory_mib",
        )
        .order_by("name", "hosts__name", "hosts__gpus__index")
    )
    regions: dict[str, tuple[dict[int, core.Node], dict[int, str]]] = {}
    for region, pk, name, status, vcpus, ram, index, model, mode, memory in rows:
        if status == RETIRED:
            continue
        nodes, names = regions.setdefault(region, ({}, {}))
        if pk not in nodes:
            names[pk] = name
            nodes[pk] = core.Node(
                pk, region, True, vcpus * 1000 if vcpus else UNLIMITED, ram or UNLIMITED
            )
        if index is not None:
            nodes[pk].gpus.append(core.Gpu(index, model, mode, memory))
    return [(region, list(nodes.values()), names) for region, (nodes, names) in regions.items()]


def _gpus(spec: Spec) -> str:
    count = spec.gpu_count if spec.mode == Mode.WHOLE else 1
    gpus = f"{count}× {spec.gpu_model.name}" if count > 1 else spec.gpu_model.name
    if spec.mode == Mode.MIG:
        return f"{gpus} GPUs in MIG mode with room for a {spec.mig_profile.name} instance"
    if spec.mode == Mode.SHARED:
        return f"{gpus} GPUs in shared mode with {mib(spec.gpu_memory_mib)} of GPU memory free"
    return f"{gpus} GPUs in whole-GPU mode"


def _why_not(spec, request, region: str, nodes: list[core.Node], names) -> str:
    """Why no host of the region holds the spec: the hosts with its GPUs that lack its vCPUs
    or RAM, named with what they have; else that none has its GPUs."""
    gpus_only = replace(request, cpu_milli=0, ram_mib=0)
    short = []
    for node in nodes:
        if place(gpus_only, [node], "first-fit") is None:
            continue
        lacks = []
        if node.free_cpu_milli < request.cpu_milli:
            lacks.append(f"{node.free_cpu_milli // 1000} vCPUs")
        if node.free_ram_mib < request.ram_mib:
            lacks.append(f"{mib(node.free_ram_mib)} of RAM")
        short.append(f"{names[node.id]} has only {' and '.join(lacks)}")
    if short:
        return (
            f"{region}: {spec.code} asks {spec.vcpus} vCPUs and {mib(spec.ram_mib)} of RAM; "
            f"{'; '.join(short)}."
        )
    return f"{region}: no host has {_gpus(spec)}."


def _thin(spec, request, node: core.Node, name: str) -> str:
    """When the host's vCPUs or RAM hold fewer instances of the spec than its GPUs do: the
    spec asks more of them per GPU than the host has (its GPUs would stay idle)."""
    cluster = Cluster([replace(node, gpus=[replace(g) for g in node.gpus])])
    gpus_only = replace(request, cpu_milli=0, ram_mib=0)
    by_gpus = 0
    while by_gpus < MAX_COUNTED and (found := place(gpus_only, cluster, "first-fit")) is not None:
        cluster.apply(found)
        by_gpus += 1
    by_cpu = node.free_cpu_milli // request.cpu_milli if request.cpu_milli else UNLIMITED
    by_ram = node.free_ram_mib // request.ram_mib if request.ram_mib else UNLIMITED
    if min(by_cpu, by_ram) >= by_gpus:
        return ""
    what = (
        f"{node.free_cpu_milli // 1000} vCPUs"
        if by_cpu <= by_ram
        else f"{mib(node.free_ram_mib)} of RAM"
    )
    return (
        f"{name}'s {what} hold {min(by_cpu, by_ram)} instances of {spec.code}, its GPUs "
        f"{by_gpus}: it asks more per GPU than the host has, and the rest of its GPUs stay idle."
    )
