"""Image locality: a host that already holds a launch's image starts it without a pull.

As Kubernetes' ImageLocality scores nodes that hold a pod's images higher, placement prefers a
host that holds the image, but only among the placements whose fragmentation rise (how much
more of the hosts' free capacity the workload is expected to leave unusable: the measure fgd
minimizes, fragmentation.py) is within `tolerance` of the policy's choice. When the policy's
choice is a holder already, or no holder can take the request, the choice stands as it is.
"""

from collections.abc import Hashable
from dataclasses import replace

from console.scheduler.cluster import Cluster
from console.scheduler.fragmentation import host_fragmentation
from console.scheduler.model import Node, Placement
from console.scheduler.workload import Distribution


def _copy(host: Node) -> Node:
    return replace(host, gpus=[replace(gpu) for gpu in host.gpus])


def rise(placement: Placement, cluster: Cluster, dist: Distribution) -> float:
    """How much `placement` raises its host's fragmentation (on a copy: the cluster stays)."""
    host = cluster.hosts[placement.host_id]
    after = _copy(host)
    Cluster([after]).apply(placement)
    return host_fragmentation(after, dist) - host_fragmentation(host, dist)


def prefer_holders(
    chosen: Placement,
    cluster: Cluster,
    holders: frozenset[Hashable],
    tolerance: float,
    policy,
) -> Placement:
    """`chosen`, or the best placement (by `policy`, on the holders alone) on a host of
    `holders` when its fragmentation rise is at most `tolerance` above `chosen`'s."""
    if chosen.host_id in holders:
        return chosen
    candidates = [_copy(host) for host_id, host in cluster.hosts.items() if host_id in holders]
    if not candidates:
        return chosen
    option = policy(chosen.request, Cluster(candidates, cluster.workload))
    if option is None:
        return chosen
    dist = cluster.workload.snapshot()
    if rise(option, cluster, dist) <= rise(chosen, cluster, dist) + tolerance:
        return option
    return chosen
