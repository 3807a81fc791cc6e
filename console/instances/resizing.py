"""What a resize does to the instance, decided in one place: the resize form labels its
choices with it, the API and the form ask for consent by it, and resize_instance acts on it.

- none: it is not running; only its record changes (the next start uses the new spec).
- live: only its vCPU and RAM limits change and its host has room for them: the agent
  updates the running container's limits; every process goes on.
- restart: its GPU slice changes (another fraction, MIG profile or GPU count) or its disk
  grows, and its GPU (for whole GPUs, its host) has room: its container is created again
  there as the new spec; its processes end, its disk stays.
- stop: its GPU model or mode changes, or its GPU or host has no room: it is stopped and
  started again wherever the new spec fits (queued while nothing does)."""

from collections.abc import Callable

from console.catalog.models import Mode, Spec
from console.instances import placement
from console.instances.models import Instance, State

NONE, LIVE, RESTART, STOP = "none", "live", "restart", "stop"
# what the tenant must allow for each (the API's field, the form's confirm page)
CONSENT = {RESTART: "allow_restart", STOP: "allow_stop"}


def same_slice(old: Spec, new: Spec) -> bool:
    """Whether the two specs hold the same GPU slice, so that only CPU and RAM differ (both
    limited: a limit cannot be lifted live)."""
    if (new.mode, new.gpu_model_id) != (old.mode, old.gpu_model_id):
        return False
    if not (old.vcpus and old.ram_mib and new.vcpus and new.ram_mib):
        return False
    if new.mode == Mode.WHOLE:
        return new.gpu_count == old.gpu_count
    if new.mode == Mode.MIG:
        return new.mig_profile_id == old.mig_profile_id
    return (new.milli, new.gpu_memory_mib) == (old.milli, old.gpu_memory_mib)


def impacts(instance: Instance) -> Callable[[Spec, bool], str]:
    """What resizing `instance` to a spec does (NONE, LIVE, RESTART or STOP), as a function
    of the spec and whether the disk grows, that reads the instance's allocation and host
    once."""
    if instance.state != State.RUNNING:
        return lambda spec, disk_grows=False: NONE
    current = instance.current_allocation()
    if current is None:
        return lambda spec, disk_grows=False: STOP
    old = instance.spec
    gpus = list(current.claims.values_list("gpu_id", flat=True).distinct())
    snap = placement.snapshot(
        instance.region_id, host_pks=[current.host_id], ignore_allocation_id=current.pk
    )

    def impact(spec: Spec, disk_grows: bool = False) -> str:
        if spec.mode != old.mode or spec.gpu_model_id != old.gpu_model_id:
            return STOP
        if same_slice(old, spec) and not disk_grows and placement.host_has_room(snap, spec):
            return LIVE
        if placement.choose(spec, snap, None if spec.mode == Mode.WHOLE else gpus) is None:
            return STOP
        return RESTART

    return impact


def describe(impact: str, instance: Instance, spec: Spec) -> str:
    """What the resize does, in a sentence for the tenant (the confirm page, the API's
    field error)."""
    if impact == RESTART:
        return (
            f"Resizing {instance.name} to {spec.name} restarts it on its GPU: every process "
            "in it ends and it starts again as the new spec; its disk stays."
        )
    if impact == STOP:
        return (
            f"{spec.name} does not fit on the GPU {instance.name} runs on now: the resize "
            f"stops it, then starts it again as {spec.name} (queued if nothing is free); "
            "every process in it ends, its disk stays."
        )
    if impact == LIVE:
        return f"{instance.name} keeps running: only its CPU and memory limits change."
    return f"{instance.name} is not running: it starts as {spec.name} next time."
