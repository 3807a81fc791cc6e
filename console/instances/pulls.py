"""What a launch's events say of its image: when the chosen host lacks it (its agent pulls it
first), an event says so, and why that host (nothing extra when the host holds it)."""

from console.catalog.spec_fit import request_for
from console.fleet.models import Host
from console.instances import placement
from console.instances.models import Allocation, Instance
from console.scheduler.policies import place

NAMED = 3  # hosts named in the event, at most


def pull_note(
    instance: Instance, allocation: Allocation, pinned: int | None, holding: frozenset[int]
) -> str:
    """The event of a placement on a host that lacks the instance's image ("" when it holds
    it, or runs workloads without images); `pinned`: the host the instance had to go to;
    `holding`: the hosts of its region that hold the image."""
    if allocation.host_id in holding:
        return ""
    host = Host.objects.only("name", "image_settings").get(pk=allocation.host_id)
    if not host.image_settings:  # a runtime without images (sim, process)
        return ""
    reference = instance.pull_reference
    pulling = f"Pulling {reference} on {host.name}"
    if pinned is not None:
        return f"{pulling}, which holds its disk"
    snap = placement.snapshot(instance.region_id, host_pks=sorted(holding)) if holding else None
    request = request_for(instance.spec)
    fitting = [
        snap.names[node.id]
        for node in (snap.hosts if snap else [])
        if place(request, [node], "first-fit") is not None
    ]
    if not fitting:
        return f"{pulling} (not on any host that fits)"
    names = ", ".join(fitting[:NAMED]) + (", …" if len(fitting) > NAMED else "")
    return f"{pulling}: the hosts that hold it ({names}) would leave more GPU capacity unusable"
