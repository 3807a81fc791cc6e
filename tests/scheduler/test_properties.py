"""Every policy, on random clusters and random request sequences, against brute force."""

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from console.scheduler.cluster import Cluster
from console.scheduler.fragmentation import host_fragmentation
from console.scheduler.model import MIG, SHARED, Node, Placement
from console.scheduler.policies import POLICIES, apply, place, release
from console.scheduler.workload import Workload
from tests.scheduler.helpers import feasible, hosts, index_view, requests, taken

pytestmark = pytest.mark.slow  # property-based: many examples


def where(placement: Placement) -> tuple:
    return placement.host_id, tuple(sorted(placement.gpu_indexes)), placement.mig_start


def free_units(host: Node) -> int:
    return sum(g.free_units for g in host.gpus if g.healthy) if host.schedulable else 0


def tightness(placement: Placement, by_id: dict[str, Node]) -> tuple:
    """best-fit's key: free milli-GPU left on the chosen GPU, then free milli-GPU, vCPU and
    RAM left on the host, then the host's order."""
    request, host = placement.request, by_id[placement.host_id]
    left = 0
    if request.gpu_count == 1 and request.mode in (SHARED, MIG):
        gpu = next(g for g in host.gpus if g.index == placement.gpu_indexes[0])
        left = gpu.free_units - request.gpu_units
    return (
        left,
        free_units(host) - request.gpu_units,
        host.free_cpu_milli - request.cpu_milli,
        host.free_ram_mib - request.ram_mib,
        list(by_id).index(host.id),
    )


def check_choice(policy: str, chosen: Placement, options: list[Placement], cluster: Cluster):
    by_id = cluster.hosts
    if policy == "first-fit":
        first = min(
            (list(by_id).index(p.host_id), p.gpu_indexes, p.mig_start or 0) for p in options
        )
        assert (list(by_id).index(chosen.host_id), chosen.gpu_indexes) == first[:2]
    elif policy == "best-fit":
        assert tightness(chosen, by_id) == min(tightness(p, by_id) for p in options)
    else:
        dist = cluster.workload.snapshot()

        def rise(p: Placement) -> float:
            host = by_id[p.host_id]
            return host_fragmentation(taken(host, p), dist) - host_fragmentation(host, dist)

        assert rise(chosen) <= min(rise(p) for p in options) + 1e-6


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    all_hosts=hosts(),
    prior=st.lists(requests(), max_size=5),
    steps=st.lists(st.tuples(requests(), st.integers(0, 5)), max_size=10),
)
def test_placements_keep_the_rules_and_release_restores(policy, all_hosts, prior, steps):
    before = copy.deepcopy(all_hosts)
    cluster = Cluster(all_hosts, Workload(prior or None))
    held: list[Placement] = []
    for request, pick in steps:
        options = feasible(request, all_hosts)
        chosen = place(request, cluster, policy)
        if chosen is None:
            assert options == []  # None only when nothing fits
        else:
            # right mode, model, region, health, schedulable host, vCPU/RAM, no overlap
            assert where(chosen) in {where(p) for p in options}
            check_choice(policy, chosen, options, cluster)
            apply(chosen, cluster)
            held.append(chosen)
        if held and pick == 0:
            release(held.pop(pick % len(held)), cluster)
        assert index_view(cluster) == index_view(Cluster(copy.deepcopy(all_hosts)))
    for placement in reversed(held):
        release(placement, cluster)
    assert all_hosts == before
    assert index_view(cluster) == index_view(Cluster(before))
