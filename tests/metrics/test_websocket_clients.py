"""gpucloud_websocket_clients{kind}: a socket counts from its accept to its end, by consumer kind;
a refused one never counts. In this process without Redis; across processes through Redis."""

import asyncio
import time

import pytest

from accounts.roles import Role
from console import socket_census
from tests.metrics.communicator import run
from tests.metrics.test_consumers import socket, token_of
from tests.metrics.test_prometheus import families, scrape

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["memory", "redis"])
def backend(request, settings):
    settings.REDIS_URL = request.getfixturevalue("redis_url") if request.param == "redis" else ""
    return request.param


def clients() -> dict[str, float]:
    found = families(scrape()[1]).get("gpucloud_websocket_clients", [])
    return {s.labels["kind"]: s.value for s in found}


async def clients_become(expected: dict, timeout: float = 5) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        got = await asyncio.to_thread(clients)
        if got == expected or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.05)


def test_connected_clients_by_kind(backend, tenant, other_tenant, make_member):
    token = token_of(make_member(tenant, Role.MEMBER))

    async def scenario():
        events = [socket("/ws/events/", token) for _ in range(2)]
        metrics = socket("/ws/metrics/", token)
        refused = socket("/ws/events/")  # no credentials
        for communicator in (*events, metrics):
            assert (await communicator.connect())[0]
        assert not (await refused.connect())[0]
        during = await clients_become({"tenant_events": 2, "tenant_metrics": 1})
        await events[0].disconnect()
        after_one = await clients_become({"tenant_events": 1, "tenant_metrics": 1})
        await events[1].disconnect()
        await metrics.disconnect()
        after_all = await clients_become({})
        return during, after_one, after_all

    during, after_one, after_all = run(scenario)
    assert during == {"tenant_events": 2, "tenant_metrics": 1}
    assert after_one == {"tenant_events": 1, "tenant_metrics": 1}
    assert after_all == {}


def test_kinds_are_named_for_their_consumers():
    from console.instances.relay import PortSocketConsumer, TerminalConsumer
    from console.metrics.consumers import FleetMetricsConsumer

    assert socket_census.kind_of(TerminalConsumer) == "terminal"
    assert socket_census.kind_of(PortSocketConsumer) == "port_socket"
    assert socket_census.kind_of(FleetMetricsConsumer) == "fleet_metrics"
