"""The Django side of scheduling: build the placement state of a region from the database,
let the placement core choose, and commit the choice as Allocation + GpuClaim rows.

The choice itself is pure (console.scheduler.placement when present, else the first-fit
below); the commit locks the host and then the chosen GPUs in primary-key order, checks the
choice again against what is committed now, and lets the unique (gpu, slot) constraint
refuse a slot another worker took meanwhile — an IntegrityError just means "place again".
"""

import logging
import secrets
from dataclasses import dataclass, field

from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from console.catalog.models import MIG_SLOTS, Mode, Spec
from console.fleet.models import Gpu, Host
from console.instances.models import Allocation, GpuClaim, Instance

log = logging.getLogger(__name__)

ATTEMPTS = 5


@dataclass
class GpuState:
    pk: int
    index: int
    model_id: int
    mode: str
    memory_mib: int
    slots: set[int] = field(default_factory=set)  # taken memory slots (whole and MIG claims)
    milli: int = 0  # shared fractions held
    memory_used: int = 0  # shared memory caps held
    claims: int = 0

    @property
    def free(self) -> bool:
        return self.claims == 0


@dataclass
class HostState:
    pk: int
    name: str
    vcpus: int  # 0: not reported, not limited
    ram_mib: int
    vcpus_used: int = 0
    ram_used: int = 0
    gpus: list[GpuState] = field(default_factory=list)

    def has_room(self, vcpus: int, ram_mib: int) -> bool:
        cpu_ok = not self.vcpus or self.vcpus_used + vcpus <= self.vcpus
        ram_ok = not self.ram_mib or self.ram_used + ram_mib <= self.ram_mib
        return cpu_ok and ram_ok


@dataclass(frozen=True)
class ClaimSpec:
    gpu_pk: int
    slot: int | None
    milli: int = 0
    memory_mib: int = 0


@dataclass(frozen=True)
class Choice:
    host_pk: int
    gpus: tuple[GpuState, ...]
    claims: tuple[ClaimSpec, ...]
    mig: dict | None = None
    shared: dict | None = None

    @property
    def gpu_pks(self) -> list[int]:
        return sorted(g.pk for g in self.gpus)


def snapshot(
    region_id: int,
    *,
    host_pks: list[int] | None = None,
    ignore_allocation_id: str | None = None,
    schedulable_only: bool = True,
) -> list[HostState]:
    """The hosts of a region as placement sees them: schedulable hosts, their healthy GPUs,
    what the current claims take, and the vCPU/RAM that current allocations use.
    `ignore_allocation_id` counts one allocation as free (a resize in place)."""
    hosts = Host.objects.filter(region_id=region_id)
    if schedulable_only:
        hosts = hosts.filter(status__in=Host.SCHEDULABLE)
    if host_pks is not None:
        hosts = hosts.filter(pk__in=host_pks)
    states = {
        h.pk: HostState(pk=h.pk, name=h.name, vcpus=h.vcpus, ram_mib=h.ram_mib)
        for h in hosts.order_by("pk")
    }
    if not states:
        return []
    gpus: dict[int, GpuState] = {}
    for gpu in Gpu.objects.filter(host_id__in=states, healthy=True).order_by("host_id", "index"):
        state = GpuState(
            pk=gpu.pk,
            index=gpu.index,
            model_id=gpu.model_id,
            mode=gpu.mode,
            memory_mib=gpu.memory_mib,
        )
        gpus[gpu.pk] = state
        states[gpu.host_id].gpus.append(state)
    claims = GpuClaim.objects.filter(gpu_id__in=gpus, allocation__released_at__isnull=True)
    if ignore_allocation_id:
        claims = claims.exclude(allocation_id=ignore_allocation_id)
    for gpu_id, slot, milli, memory in claims.values_list("gpu_id", "slot", "milli", "memory_mib"):
        state = gpus[gpu_id]
        state.claims += 1
        if slot is not None:
            state.slots.add(slot)
        state.milli += milli
        state.memory_used += memory
    allocations = Allocation.objects.filter(host_id__in=states, released_at__isnull=True)
    if ignore_allocation_id:
        allocations = allocations.exclude(pk=ignore_allocation_id)
    for row in allocations.values("host_id").annotate(cpu=Sum("vcpus"), ram=Sum("ram_mib")):
        states[row["host_id"]].vcpus_used = row["cpu"] or 0
        states[row["host_id"]].ram_used = row["ram"] or 0
    return list(states.values())


# --- the choice ---------------------------------------------------------------------------


def _candidates(spec: Spec, host: HostState, gpu_pks: list[int] | None) -> list[GpuState]:
    return [
        g
        for g in host.gpus
        if g.model_id == spec.gpu_model_id
        and g.mode == spec.mode
        and (gpu_pks is None or g.pk in gpu_pks)
    ]


def _fit_on_host(spec: Spec, host: HostState, gpu_pks: list[int] | None) -> Choice | None:
    if not host.has_room(spec.vcpus, spec.ram_mib):
        return None
    gpus = _candidates(spec, host, gpu_pks)
    if spec.mode == Mode.WHOLE:
        free = [g for g in gpus if g.free]
        if len(free) < spec.gpu_count:
            return None
        chosen = tuple(free[: spec.gpu_count])
        claims = tuple(ClaimSpec(g.pk, slot) for g in chosen for slot in range(MIG_SLOTS))
        return Choice(host.pk, chosen, claims)
    if spec.mode == Mode.MIG:
        profile = spec.mig_profile
        # best fit: the fullest GPU that still has a legal start, keeping empty GPUs whole
        for gpu in sorted(gpus, key=lambda g: -len(g.slots)):
            if gpu.milli:
                continue
            for start in sorted(profile.starts, reverse=True):
                wanted = set(range(start, start + profile.size))
                if not wanted & gpu.slots and start + profile.size <= MIG_SLOTS:
                    claims = tuple(ClaimSpec(gpu.pk, slot) for slot in sorted(wanted))
                    mig = {"profile": profile.name, "start": start, "size": profile.size}
                    return Choice(host.pk, (gpu,), claims, mig=mig)
        return None
    # shared: best fit by fraction already used
    for gpu in sorted(gpus, key=lambda g: -g.milli):
        if gpu.slots:
            continue
        if gpu.milli + spec.milli <= 1000 and gpu.memory_used + spec.gpu_memory_mib <= gpu.memory_mib:
            claim = ClaimSpec(gpu.pk, None, spec.milli, spec.gpu_memory_mib)
            shared = {"milli": spec.milli, "memory_mib": spec.gpu_memory_mib}
            return Choice(host.pk, (gpu,), (claim,), shared=shared)
    return None


def choose(spec: Spec, hosts: list[HostState], gpu_pks: list[int] | None = None) -> Choice | None:
    """Where `spec` goes among `hosts`, or None when it fits nowhere now."""
    fits = [c for c in (_fit_on_host(spec, h, gpu_pks) for h in hosts) if c is not None]
    if not fits:
        return None
    # prefer the host that is already the busiest (packs hosts, leaves whole hosts free)
    used = {h.pk: sum(g.claims for g in h.gpus) for h in hosts}
    return max(fits, key=lambda c: (used[c.host_pk], -c.host_pk))


def fits_now(spec: Spec, hosts: list[HostState]) -> bool:
    return choose(spec, hosts) is not None


# --- the commit ----------------------------------------------------------------------------


class _Moved(Exception):
    """The state changed between the choice and the locks: choose again."""


def new_allocation_id(instance: Instance) -> str:
    return f"inst-{instance.pk}-{secrets.token_hex(4)}"


def agent_request(instance: Instance, spec: Spec, choice: Choice) -> dict:
    """The body of the agent's PUT /v1/allocations/{id}."""
    return {
        "mode": spec.mode,
        "gpus": [g.index for g in sorted(choice.gpus, key=lambda g: g.index)],
        "mig": choice.mig,
        "shared": choice.shared,
        "labels": {
            "instance": str(instance.pk),
            "name": instance.name,
            "tenant": str(instance.tenant_id),
            "spec": spec.code,
        },
    }


def allocate(
    instance: Instance,
    spec: Spec,
    *,
    host_pk: int | None = None,
    gpu_pks: list[int] | None = None,
    replacing: Allocation | None = None,
) -> Allocation | None:
    """Place `instance` with `spec` in its region and commit the slice, or answer None when
    nothing fits. Runs inside the caller's transaction (which holds the instance's lock).

    `host_pk`/`gpu_pks` restrict the choice (a resize in place); `replacing` is an allocation
    of the instance whose slice counts as free and is released in the same commit."""
    ignore = replacing.pk if replacing else None
    for _attempt in range(ATTEMPTS):
        hosts = snapshot(
            instance.region_id, host_pks=[host_pk] if host_pk else None, ignore_allocation_id=ignore
        )
        choice = choose(spec, hosts, gpu_pks)
        if choice is None:
            return None
        try:
            with transaction.atomic():
                return _commit(instance, spec, choice, replacing)
        except (_Moved, IntegrityError) as exc:
            log.info("placement of instance %s raced (%s); placing again", instance.pk, exc)
    return None


def _commit(instance, spec, choice: Choice, replacing) -> Allocation:
    host = Host.objects.select_for_update().get(pk=choice.host_pk)
    if not host.schedulable:
        raise _Moved(f"host {host.name} is {host.status}")
    locked = list(
        Gpu.objects.select_for_update().filter(pk__in=choice.gpu_pks).order_by("pk")
    )
    if len(locked) != len(choice.gpus):
        raise _Moved("a GPU went away")
    # what is committed now, under the locks: the choice must still hold
    fresh = snapshot(
        instance.region_id,
        host_pks=[host.pk],
        ignore_allocation_id=replacing.pk if replacing else None,
    )
    again = choose(spec, fresh, choice.gpu_pks)
    if again is None:
        raise _Moved("the slice was taken")
    if replacing is not None:
        release(replacing)
    allocation = Allocation.objects.create(
        id=new_allocation_id(instance),
        instance=instance,
        host=host,
        mode=spec.mode,
        request=agent_request(instance, spec, again),
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
        for claim in again.claims
    )
    return allocation


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


def free_capacity(region_id: int) -> dict[int, bool]:
    """{spec pk: fits now} for every active spec, for the launch form."""
    hosts = snapshot(region_id)
    return {spec.pk: fits_now(spec, hosts) for spec in Spec.objects.filter(active=True).select_related("mig_profile")}

