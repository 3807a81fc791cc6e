"""The Django side of scheduling: build the placement state of a region from the database,
let the placement core (console.scheduler, FGD by default) choose, and commit the choice as
Allocation + GpuClaim rows.

The commit locks the host and then the chosen GPUs in primary-key order, rebuilds that
host's state from what is committed now and applies the choice to it (the core refuses a
choice that no longer fits), and lets the unique (gpu, slot) constraint refuse a slot that
another worker took meanwhile — either way the placement is simply made again.
"""

import logging
import secrets
from dataclasses import dataclass, field, replace

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Sum
from django.utils import timezone

from console import secret_env
from console.catalog.models import MIG_SLICES, Mode, Spec
from console.catalog.spec_fit import request_for
from console.fleet import locks as fleet_locks
from console.fleet.models import Gpu, Host
from console.instances import sign_in
from console.instances.models import Allocation, GpuClaim, Instance
from console.scheduler import locality
from console.scheduler import model as core
from console.scheduler.cluster import Cluster
from console.scheduler.policies import POLICIES, place
from console.scheduler.workload import Workload

log = logging.getLogger(__name__)

ATTEMPTS = 10


class Busy(Exception):
    """Other workers kept taking the chosen slices: placing again later will do."""


POLICY = "fgd"
UNLIMITED = 10**9  # a host that reports no vCPU/RAM figure is not limited by it


@dataclass
class Snapshot:
    """The placement state of some hosts: the core's Host objects, and the database keys of
    their GPUs by (host pk, GPU index)."""

    hosts: list[core.Node]
    gpu_pks: dict[tuple[int, int], int]
    names: dict[int, str] = field(default_factory=dict)  # host pk → name, for messages

    def restricted(self, gpu_pks: list[int]) -> "Snapshot":
        """The same hosts, with only the GPUs in `gpu_pks` eligible (a resize in place)."""
        wanted = {key for key, pk in self.gpu_pks.items() if pk in gpu_pks}
        hosts = [
            replace(
                host,
                gpus=[
                    replace(g, healthy=g.healthy and (host.id, g.index) in wanted)
                    for g in host.gpus
                ],
            )
            for host in self.hosts
        ]
        return Snapshot(hosts, self.gpu_pks)


@dataclass(frozen=True)
class ClaimSpec:
    gpu_pk: int
    slot: int | None
    milli: int = 0
    memory_mib: int = 0


@dataclass(frozen=True)
class Choice:
    """A placement of the core, in database terms."""

    host_pk: int
    gpu_indexes: tuple[int, ...]
    claims: tuple[ClaimSpec, ...]
    placement: core.Placement
    mig: dict | None = None
    shared: dict | None = None

    @property
    def gpu_pks(self) -> list[int]:
        return sorted({c.gpu_pk for c in self.claims})


def snapshot(
    region_id: int,
    *,
    host_pks: list[int] | None = None,
    ignore_allocation_id: str | None = None,
    empty: bool = False,
) -> Snapshot:
    """The hosts of a region as placement sees them: schedulable only when active, GPUs with
    their health, mode and model, what the current claims take of each, and the vCPU/RAM
    that current allocations leave. `ignore_allocation_id` counts one allocation as free (a
    resize in place).

    `empty`: the region's hardware as if nothing ran on it and every host but the retired
    ones took work, every GPU healthy: what could ever be placed there."""
    hosts_qs = Host.objects.filter(region_id=region_id).select_related("region")
    if host_pks is not None:
        hosts_qs = hosts_qs.filter(pk__in=host_pks)
    if empty:
        hosts_qs = hosts_qs.exclude(status=Host.Status.RETIRED)
    hosts: dict[int, core.Node] = {}
    names: dict[int, str] = {}
    for h in hosts_qs.order_by("pk"):
        names[h.pk] = h.name
        hosts[h.pk] = core.Node(
            id=h.pk,
            region=h.region.code,
            schedulable=empty or h.schedulable,
            free_cpu_milli=h.vcpus * 1000 if h.vcpus else UNLIMITED,
            free_ram_mib=h.ram_mib or UNLIMITED,
        )
    if not hosts:
        return Snapshot([], {})
    gpus: dict[int, core.Gpu] = {}
    gpu_pks: dict[tuple[int, int], int] = {}
    for g in (
        Gpu.objects.filter(host_id__in=hosts).select_related("model").order_by("host_id", "index")
    ):
        gpu = core.Gpu(
            index=g.index,
            model=g.model.code,
            mode=g.mode,
            memory_mib=g.memory_mib,
            healthy=empty or (g.healthy and not g.mode_changing_to),
        )
        gpus[g.pk] = gpu
        gpu_pks[(g.host_id, g.index)] = g.pk
        hosts[g.host_id].gpus.append(gpu)
    if empty:
        return Snapshot(list(hosts.values()), gpu_pks, names)
    claims = GpuClaim.objects.filter(gpu_id__in=gpus, allocation__released_at__isnull=True)
    if ignore_allocation_id:
        claims = claims.exclude(allocation_id=ignore_allocation_id)
    for gpu_id, slot, milli, memory in claims.values_list("gpu_id", "slot", "milli", "memory_mib"):
        gpu = gpus[gpu_id]
        if slot is None:
            gpu.used_milli += milli
            gpu.used_memory_mib += memory
        elif gpu.mode == Mode.MIG:
            gpu.mig_used |= 1 << slot
        else:
            gpu.taken = True
    allocations = Allocation.objects.filter(host_id__in=hosts, released_at__isnull=True)
    if ignore_allocation_id:
        allocations = allocations.exclude(pk=ignore_allocation_id)
    for row in allocations.values("host_id").annotate(cpu=Sum("vcpus"), ram=Sum("ram_mib")):
        host = hosts[row["host_id"]]
        host.free_cpu_milli -= (row["cpu"] or 0) * 1000
        host.free_ram_mib -= row["ram"] or 0
    return Snapshot(list(hosts.values()), gpu_pks, names)


# --- the choice ---------------------------------------------------------------------------


_workloads: dict[tuple, Workload] = {}


def catalog_workload() -> Workload:
    """The workload FGD plans for: the active specs of the catalog, one each. Kept while the
    catalog stays the same (FGD memoizes its scores with it)."""
    specs = list(
        Spec.objects.filter(active=True).select_related("gpu_model", "mig_profile").order_by("pk")
    )
    key = tuple(request_for(s) for s in specs)
    if key not in _workloads:
        if len(_workloads) > 8:
            _workloads.clear()
        _workloads[key] = Workload(prior=list(key) or None, learn=False)
    return _workloads[key]


def choose(
    spec: Spec,
    snap: Snapshot,
    gpu_pks: list[int] | None = None,
    holders: frozenset[int] = frozenset(),
) -> Choice | None:
    """Where `spec` goes among the snapshot's hosts (only on `gpu_pks` when given), or None
    when it fits nowhere now. `holders`: the hosts that hold the launch's image, one of which
    is preferred where it costs at most IMAGE_LOCALITY_TOLERANCE more fragmentation
    (console/scheduler/locality.py); none: the policy's choice as it is."""
    if gpu_pks is not None:
        snap = snap.restricted(gpu_pks)
    if not snap.hosts:
        return None
    request = request_for(spec)
    cluster = Cluster([replace(h, gpus=list(h.gpus)) for h in snap.hosts], catalog_workload())
    placement = place(request, cluster, policy=POLICY)
    if placement is None:
        return None
    if holders:
        placement = locality.prefer_holders(
            placement, cluster, holders, settings.IMAGE_LOCALITY_TOLERANCE, POLICIES[POLICY]
        )
    return _choice(spec, snap, placement)


def _choice(spec: Spec, snap: Snapshot, placement: core.Placement) -> Choice:
    host_pk = placement.host_id
    indexes = tuple(sorted(placement.gpu_indexes))
    pks = [snap.gpu_pks[(host_pk, i)] for i in indexes]
    if spec.mode == Mode.WHOLE:
        claims = tuple(ClaimSpec(pk, slot) for pk in pks for slot in range(MIG_SLICES))
        return Choice(host_pk, indexes, claims, placement)
    if spec.mode == Mode.MIG:
        profile, start = spec.mig_profile, placement.mig_start
        claims = tuple(ClaimSpec(pks[0], slot) for slot in range(start, start + profile.size))
        mig = {"profile": profile.name, "start": start, "size": profile.size}
        return Choice(host_pk, indexes, claims, placement, mig=mig)
    claim = ClaimSpec(pks[0], None, spec.milli, spec.gpu_memory_mib)
    shared = {"milli": spec.milli, "memory_mib": spec.gpu_memory_mib}
    return Choice(host_pk, indexes, (claim,), placement, shared=shared)


def fits_now(spec: Spec, snap: Snapshot) -> bool:
    """Whether `spec` fits somewhere in the snapshot now. Where does not matter, so first fit
    answers: every policy finds a place exactly when one exists (tests/scheduler), and first
    fit needs neither the catalog's workload (a query) nor FGD's scores. Placing only reads the
    hosts (apply and release change them), so the snapshot's own serve."""
    return bool(snap.hosts) and place(request_for(spec), snap.hosts, "first-fit") is not None


@dataclass(frozen=True)
class Shortfall:
    """A host whose GPUs could hold a spec but whose vCPUs or RAM (as the snapshot leaves
    them) could not: what it has and what the spec asks, None where that is enough."""

    host: str
    vcpus: tuple[int, int] | None
    ram_mib: tuple[int, int] | None


def shortfalls(spec: Spec, snap: Snapshot) -> list[Shortfall]:
    """The snapshot's hosts that have the GPUs for `spec` but too few vCPUs or too little RAM
    for it: why a spec that "fits nowhere" does not, when the GPUs are there. First fit on
    each host alone, for the GPUs only (the same rules as fits_now)."""
    request = request_for(spec)
    gpus_only = replace(request, cpu_milli=0, ram_mib=0)
    found = []
    for node in snap.hosts:
        if place(gpus_only, [node], "first-fit") is None:
            continue
        vcpus = (node.free_cpu_milli // 1000, spec.vcpus)
        ram = (node.free_ram_mib, spec.ram_mib)
        short = Shortfall(
            snap.names.get(node.id, str(node.id)),
            vcpus if node.free_cpu_milli < request.cpu_milli else None,
            ram if node.free_ram_mib < request.ram_mib else None,
        )
        if short.vcpus or short.ram_mib:
            found.append(short)
    return found


def count_fits(spec: Spec, snap: Snapshot, limit: int) -> int:
    """How many instances of `spec` the snapshot's free capacity holds now, one placed after
    the other (first fit, as fits_now), up to `limit`. Works on a copy: the snapshot stays."""
    if not snap.hosts:
        return 0
    cluster = Cluster([replace(h, gpus=[replace(g) for g in h.gpus]) for h in snap.hosts])
    request = request_for(spec)
    count = 0
    while count < limit and (found := place(request, cluster, "first-fit")) is not None:
        cluster.apply(found)
        count += 1
    return count


def still_fits(choice: Choice, snap: Snapshot) -> bool:
    """Whether the choice fits the (fresher) snapshot: the core applies it or refuses."""
    try:
        Cluster(snap.hosts, catalog_workload()).apply(choice.placement)
    except (ValueError, KeyError):
        return False
    return True


class _Moved(Exception):
    """The state changed between the choice and the locks: choose again."""


def new_allocation_id(instance: Instance) -> str:
    return f"inst-{instance.pk}-{secrets.token_hex(4)}"


def resources(spec: Spec) -> dict:
    """What the kernel enforces; a spec without vCPUs or RAM (0) is not limited in that."""
    return {
        name: value
        for name, value in (
            ("vcpus", spec.vcpus),
            ("memory_mib", spec.ram_mib),
            ("pids", settings.INSTANCE_PIDS_LIMIT),
            ("layer_gib", settings.INSTANCE_LAYER_GIB),
        )
        if value
    }


LIVE_LIMITS = ("vcpus", "memory_mib", "pids")


def host_has_room(snap: Snapshot, spec: Spec) -> bool:
    """Whether the snapshot's one host has the spec's vCPUs and RAM free."""
    return bool(snap.hosts) and (
        snap.hosts[0].free_cpu_milli >= spec.vcpus * 1000
        and snap.hosts[0].free_ram_mib >= spec.ram_mib
    )


def resize_in_place(instance: Instance, allocation: Allocation, spec: Spec) -> bool:
    """A live resize in the database: the allocation keeps its slice and takes the spec's
    vCPUs, RAM and limits, when its host (locked first, then read again; the allocation's
    own share counted free) still has them. Answers whether it did. Runs inside the
    caller's transaction."""
    if connection.vendor != "sqlite":  # SQLite's IMMEDIATE transaction already serialises
        fleet_locks.host(allocation.host_id)
    snap = snapshot(
        instance.region_id, host_pks=[allocation.host_id], ignore_allocation_id=allocation.pk
    )
    if not host_has_room(snap, spec):
        return False
    allocation.request = {**allocation.request, "resources": resources(spec)}
    allocation.vcpus, allocation.ram_mib = spec.vcpus, spec.ram_mib
    Allocation.objects.filter(pk=allocation.pk).update(
        request=allocation.request, vcpus=spec.vcpus, ram_mib=spec.ram_mib
    )
    return True


def live_limits(request: dict) -> dict:
    """The limits of an allocation's agent request that a live resize sends the agent
    (PUT /v1/allocations/{id}/limits)."""
    limits = request.get("resources") or {}
    return {name: limits[name] for name in LIVE_LIMITS if name in limits}


def agent_request(instance: Instance, spec: Spec, choice: Choice) -> dict:
    """The body of the agent's PUT /v1/allocations/{id}: the slice, and the workload (image,
    command, environment, limits, disk). The command is the tenant's, else the image's
    default, else None (the image's own CMD); the environment is the image's default with
    the tenant's laid over it, and the instance's app token when its image serves Jupyter."""
    ports = instance.image_ports
    return {
        "mode": spec.mode,
        "gpus": list(choice.gpu_indexes),
        "mig": choice.mig,
        "shared": choice.shared,
        "image": instance.pull_reference,
        "command": instance.command or instance.image_command or None,
        "env": {
            **instance.image_env,
            **instance.env,
            **sign_in.token_env(ports, instance.app_token),
        },
        "resources": resources(spec),
        "volume": {"name": instance.disk_name}
        | ({"size_gib": instance.disk_gib} if instance.disk_gib else {}),
        "volumes": [
            {
                "name": volume.disk_name,
                "owner": volume.owner,
                "size_gib": volume.size_gib,
                "mount_path": volume.mount_path,
            }
            for volume in instance.volumes.order_by("pk")
        ],
        "labels": {
            "instance": str(instance.pk),
            "name": instance.name,
            "tenant": str(instance.tenant_id),
            "spec": spec.code,
        },
    }


def agent_body(request: dict, sealed: dict, registry_auth: dict | None = None) -> dict:
    """The agent request as sent: the stored one (which holds no secret) with the instance's
    sealed secrets opened into its environment, over the image's and the plain env's names,
    and the tenant's credential for its image's registry (registry_credentials.pull_auth),
    which the agent uses for that pull only and keeps nowhere."""
    body = dict(request)
    if sealed:
        body["env"] = {**request.get("env", {}), **secret_env.open_all(sealed)}
    if registry_auth:
        body["registry_auth"] = registry_auth
    return body


def allocate(
    instance: Instance,
    spec: Spec,
    *,
    host_pk: int | None = None,
    gpu_pks: list[int] | None = None,
    replacing: Allocation | None = None,
    holders: frozenset[int] = frozenset(),
) -> Allocation | None:
    """Place `instance` with `spec` in its region and commit the slice, or answer None when
    nothing fits (Busy when other workers kept winning the race for the slices it chose).
    Runs inside the caller's transaction (which holds the instance's lock).

    `host_pk`/`gpu_pks` restrict the choice (a resize in place); `replacing` is an allocation
    of the instance whose slice counts as free and is released in the same commit; `holders`:
    the hosts that hold its image, one of which is worth a little (see `choose`)."""
    ignore = replacing.pk if replacing else None
    for _attempt in range(ATTEMPTS):
        snap = snapshot(
            instance.region_id, host_pks=[host_pk] if host_pk else None, ignore_allocation_id=ignore
        )
        choice = choose(spec, snap, gpu_pks, holders)
        if choice is None:
            return None
        try:
            with transaction.atomic():
                return _commit(instance, spec, choice, replacing)
        except (_Moved, IntegrityError) as exc:
            log.info("placement of instance %s raced (%s); placing again", instance.pk, exc)
    raise Busy(f"instance {instance.pk}: {ATTEMPTS} placements in a row were taken meanwhile")


def _commit(instance, spec, choice: Choice, replacing) -> Allocation:
    # SQLite needs no second look: its IMMEDIATE transaction, which took the snapshot,
    # serialises writers, so the host, its GPUs and their claims are as the snapshot saw them.
    if connection.vendor != "sqlite":
        _check_still_free(instance, choice, replacing)
    if replacing is not None:
        release(replacing)
    allocation = Allocation.objects.create(
        id=new_allocation_id(instance),
        instance=instance,
        host_id=choice.host_pk,
        mode=spec.mode,
        request=agent_request(instance, spec, choice),
        vcpus=spec.vcpus,
        ram_mib=spec.ram_mib,
    )
    GpuClaim.objects.bulk_create(
        GpuClaim(
            allocation=allocation,
            gpu_id=claim.gpu_pk,
            slot=claim.slot,
            milli=claim.milli,
            memory_mib=claim.memory_mib,
        )
        for claim in choice.claims
    )
    if instance.disk_host_id is None:  # its first placement: the disk is made there
        instance.disk_host_id = choice.host_pk
        Instance.objects.filter(pk=instance.pk).update(disk_host_id=choice.host_pk)
    instance.volumes.filter(host__isnull=True).update(host_id=choice.host_pk)  # made there too
    return allocation


def pinned_host(instance: Instance) -> int | None:
    """The host an instance must be placed on: the one that holds its disk, else the one that
    holds the volumes attached to it (None: any host of its region)."""
    if instance.disk_host_id is not None:
        return instance.disk_host_id
    return instance.volumes.filter(host__isnull=False).values_list("host_id", flat=True).first()


def _check_still_free(instance, choice: Choice, replacing) -> None:
    """Lock the chosen host and GPUs; what is committed now, under the locks, must still
    hold the choice (_Moved otherwise: choose again)."""
    host = fleet_locks.host(choice.host_pk)
    if not host.schedulable:
        raise _Moved(f"host {host.name} is {host.status}")
    locked = fleet_locks.gpus(choice.gpu_pks)
    if len(locked) != len(choice.gpu_pks):
        raise _Moved("a GPU went away")
    fresh = snapshot(
        instance.region_id,
        host_pks=[host.pk],
        ignore_allocation_id=replacing.pk if replacing else None,
    )
    if not still_fits(choice, fresh):
        raise _Moved("the slice was taken")


def release(allocation: Allocation, at=None) -> None:
    """Free the allocation's slice in the database (its claims go; the row stays, released)."""
    GpuClaim.objects.filter(allocation=allocation).delete()
    if allocation.released_at is None:
        allocation.released_at = at or timezone.now()
        Allocation.objects.filter(pk=allocation.pk).update(released_at=allocation.released_at)


def describe(allocation: Allocation) -> dict:
    """Host, GPUs and slice of an allocation, for operators."""
    request = allocation.request or {}
    slice_text = "whole GPU" + ("s" if len(request.get("gpus", [])) > 1 else "")
    if request.get("mig"):
        mig = request["mig"]
        slice_text = f"MIG {mig['profile']} at slot {mig['start']}"
    elif request.get("shared"):
        shared = request["shared"]
        slice_text = f"{shared['milli']}/1000 GPU, {shared['memory_mib']} MiB"
    return {
        "allocation": allocation.pk,
        "host": allocation.host.name,
        "gpus": request.get("gpus", []),
        "slice": slice_text,
        "released": allocation.released_at is not None,
    }
