"""Image locality (console/scheduler/locality.py): a host that holds the image is preferred
among the placements within the tolerance of the policy's choice, and only there; with no
holder the choice is the policy's, whatever the tolerance."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from console.scheduler.cluster import Cluster
from console.scheduler.locality import prefer_holders, rise
from console.scheduler.model import SHARED, Gpu, Node, Request
from console.scheduler.policies import POLICIES, place
from console.scheduler.workload import Workload
from tests.scheduler.helpers import hosts, requests

QUARTER = Request(SHARED, milli=250, gpu_memory_mib=20480, cpu_milli=2000, ram_mib=8192)
HALF = Request(SHARED, milli=500, gpu_memory_mib=40960, cpu_milli=2000, ram_mib=8192)
FGD = POLICIES["fgd"]


def node(name: str, used_milli: int = 0) -> Node:
    gpus = [Gpu(index=i, model="a100", mode=SHARED, memory_mib=81920) for i in range(2)]
    gpus[0].used_milli, gpus[0].used_memory_mib = used_milli, used_milli * 80
    return Node(name, "eu", True, 64000, 262144, gpus)


def cluster(*nodes: Node) -> Cluster:
    return Cluster(nodes, Workload(prior=[QUARTER, HALF], learn=False))


def test_a_holder_that_costs_no_more_fragmentation_is_chosen():
    both = cluster(node("without"), node("with"))
    chosen = place(QUARTER, both)
    assert chosen.host_id == "without"  # the policy's tie-break: the first host
    preferred = prefer_holders(chosen, both, frozenset({"with"}), 0.0, FGD)
    assert preferred.host_id == "with"
    assert preferred.gpu_indexes == chosen.gpu_indexes


def test_a_holder_that_would_fragment_more_than_the_tolerance_is_not_chosen():
    # a quarter packs best beside the quarter already on "busy"; the idle holder's fresh
    # GPU would leave 750 milli that halves use only in part
    both = cluster(node("busy", used_milli=250), node("idle"))
    chosen = place(QUARTER, both)
    assert chosen.host_id == "busy"
    option = place(QUARTER, cluster(node("idle")))
    extra = rise(option, cluster(node("idle")), both.workload.snapshot()) - rise(
        chosen, both, both.workload.snapshot()
    )
    assert extra > 0
    assert prefer_holders(chosen, both, frozenset({"idle"}), extra * 0.9, FGD) == chosen
    assert prefer_holders(chosen, both, frozenset({"idle"}), extra, FGD).host_id == "idle"


def test_a_holder_that_cannot_take_the_request_changes_nothing():
    full = node("full")
    for gpu in full.gpus:
        gpu.used_milli, gpu.used_memory_mib = 1000, 81920
    both = cluster(node("free"), full)
    chosen = place(QUARTER, both)
    assert prefer_holders(chosen, both, frozenset({"full"}), 10**6, FGD) is chosen


@pytest.mark.slow  # property-based: many examples
@settings(max_examples=200, deadline=None)
@given(hosts(), requests(), st.floats(0, 2000))
def test_without_a_holder_the_policys_choice_stands_and_a_holder_is_only_chosen_in_tolerance(
    nodes, request, tolerance
):
    whole = Cluster(nodes, Workload())
    chosen = place(request, whole)
    if chosen is None:
        return
    assert prefer_holders(chosen, whole, frozenset(), tolerance, FGD) is chosen
    others = frozenset(n.id for n in nodes if n.id != chosen.host_id)
    preferred = prefer_holders(chosen, whole, others, tolerance, FGD)
    dist = whole.workload.snapshot()
    if preferred is not chosen:
        assert preferred.host_id in others
        assert rise(preferred, whole, dist) <= rise(chosen, whole, dist) + tolerance
    Cluster(nodes).apply(preferred)  # it fits where it was chosen
