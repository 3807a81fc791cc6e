"""fgd's indexed, pruned search decides as the straightforward one: every host, every GPU
state, the same score and tie-breaks (helpers.fgd_everywhere)."""

import copy
import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from console.scheduler import cluster as cluster_module
from console.scheduler.cluster import Cluster
from console.scheduler.model import MILLI, SHARED, Gpu, Node, Placement, Request
from console.scheduler.policies import apply, place, release
from console.scheduler.workload import Workload
from tests.scheduler.helpers import fgd_everywhere, hosts, requests

pytestmark = pytest.mark.slow  # property-based: many examples

# many distinct fractions, so that GPUs take many states
FRACTIONS = (100, 125, 200, 250, 300, 333, 460, 500, 600, 750, 810, 1000)


@st.composite
def shared_hosts(draw) -> list[Node]:
    """A trace-like cluster: shared GPUs, and vCPU or RAM that may run out first."""
    return [
        Node(
            id=f"h{i}",
            region="eu",
            schedulable=True,
            free_cpu_milli=draw(st.sampled_from((8000, 16000, 32000, 96000))),
            free_ram_mib=draw(st.sampled_from((32768, 131072, 524288))),
            gpus=[
                Gpu(index=j, model=draw(st.sampled_from(("t4", "v100"))), mode=SHARED, memory_mib=0)
                for j in range(draw(st.integers(1, 8)))
            ],
        )
        for i in range(draw(st.integers(1, 12)))
    ]


@st.composite
def shared_requests(draw) -> Request:
    count = draw(st.sampled_from((0, 1, 1, 1, 1, 2, 4)))
    return Request(
        SHARED,
        gpu_count=count,
        milli=draw(st.sampled_from(FRACTIONS)) if count == 1 else MILLI if count else 0,
        cpu_milli=draw(st.sampled_from((0, 1000, 2000, 4000, 8000, 12000))),
        ram_mib=draw(st.sampled_from((0, 4096, 16384, 65536))),
    )


def replay(all_hosts: list[Node], prior: list[Request], steps: list[tuple[Request, int]]):
    """Place each request with fgd, check the straightforward search picks the same, apply;
    release an earlier one now and then."""
    cluster = Cluster(all_hosts, Workload(prior or None))
    held: list[Placement] = []
    for request, pick in steps:
        reference = copy.deepcopy(cluster)
        reference.workload.observe(request)
        chosen = place(request, cluster)
        assert chosen == fgd_everywhere(request, reference)
        assert_kinds_kept(cluster)
        if chosen is not None:
            apply(chosen, cluster)
            held.append(chosen)
        if held and pick == 0:
            release(held.pop(len(held) // 2), cluster)


def assert_kinds_kept(cluster: Cluster) -> None:
    """Each bucket's hosts with stranded capacity are all under their kind, lowest order
    first, and its kinds are listed once each, most free vCPU first."""
    buckets = [states.values() for states in cluster.groups.values()]
    for bucket in [cluster.everyone, *itertools.chain(*buckets)]:
        assert bucket.starved == sorted(bucket.kinds, key=lambda kind: (-kind[1], kind))
        for members in bucket.kinds.values():
            assert members and members == sorted(members)
            assert all(cluster.stranded[host_id] > 0 for _, host_id in members)
        assert all(cluster.stranded[entry[4]] == 0 for entry in bucket.slack)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    all_hosts=shared_hosts(),
    steps=st.lists(st.tuples(shared_requests(), st.integers(0, 3)), max_size=40),
)
def test_fgd_decides_as_the_straightforward_search_on_trace_like_clusters(all_hosts, steps):
    replay(all_hosts, [], steps)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    all_hosts=hosts(),
    prior=st.lists(requests(), max_size=5),
    steps=st.lists(st.tuples(requests(), st.integers(0, 3)), max_size=15),
)
def test_fgd_decides_as_the_straightforward_search_in_every_mode(all_hosts, prior, steps):
    replay(all_hosts, prior, steps)


# two mixes of eleven fractions: the first that of bench/scheduler.py --fractions
MIXES = (
    (100, 125, 200, 250, 300, 333, 460, 500, 600, 750, 810),
    (50, 125, 175, 230, 290, 333, 410, 470, 530, 660, 875),
)


@pytest.mark.parametrize("log_min", [cluster_module.LOG_MIN, 0])
@pytest.mark.parametrize("fractions", MIXES)
def test_fgd_decides_as_the_straightforward_search_on_mixes_of_eleven_fractions(
    fractions, log_min, monkeypatch
):
    """Hundreds of requests on a trace-like cluster, many GPU states: each shape's ranking
    of states, kept up to date as buckets come and go (and started again whenever the log
    of created buckets outgrows them, with log_min 0), leaves every decision as it was."""
    monkeypatch.setattr(cluster_module, "LOG_MIN", log_min)
    draw = random.Random(fractions[0])
    all_hosts = [
        Node(
            id=f"h{i}",
            region="eu",
            schedulable=True,
            free_cpu_milli=draw.choice((16000, 32000, 96000)),
            free_ram_mib=draw.choice((65536, 131072, 524288)),
            gpus=[
                Gpu(j, draw.choice(("t4", "v100")), SHARED, 0) for j in range(draw.randint(1, 8))
            ],
        )
        for i in range(30)
    ]
    steps = drawn_steps(
        draw,
        300,
        (0, 1, 1, 1, 1, 1, 1, 2),
        fractions,
        (1000, 2000, 4000, 8000),
        (4096, 16384, 32768),
    )
    replay(all_hosts, [], steps)


def test_fgd_decides_as_the_straightforward_search_on_a_fleet_of_one_host_type():
    """Forty hosts alike, as a fleet bought in one order: most of them share a kind (what
    they have free) while they fill, and a kind's lowest-ordered host must win its ties
    as the straightforward search has them, while hosts leave and rejoin kinds."""
    draw = random.Random(7)
    all_hosts = [
        Node(f"h{i}", "eu", True, 96000, 393216, [Gpu(j, "t4", SHARED, 0) for j in range(8)])
        for i in range(40)
    ]
    steps = drawn_steps(
        draw,
        400,
        (0, 1, 1, 1, 1, 1, 2, 4),
        MIXES[0],
        (1000, 4000, 8000, 16000),
        (4096, 16384, 65536),
    )
    replay(all_hosts, [], steps)


def drawn_steps(
    draw: random.Random,
    length: int,
    counts: tuple[int, ...],
    fractions: tuple[int, ...],
    cpus: tuple[int, ...],
    rams: tuple[int, ...],
) -> list[tuple[Request, int]]:
    """`length` shared requests of GPU counts, fractions, vCPU and RAM drawn from those
    given, each with a pick of 0-2 for replay (0: an earlier one is released)."""
    steps = []
    for _ in range(length):
        count = draw.choice(counts)
        request = Request(
            SHARED,
            gpu_count=count,
            milli=draw.choice(fractions) if count == 1 else MILLI if count else 0,
            cpu_milli=draw.choice(cpus),
            ram_mib=draw.choice(rams),
        )
        steps.append((request, draw.randint(0, 2)))
    return steps
