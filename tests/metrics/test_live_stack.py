"""Through the real stack: a real agent process pushes samples to the real ASGI server
(uvicorn), which publishes them through the Redis channel layer to real websocket clients."""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from accounts.roles import Role
from tests.metrics.realstack import bring_up_host, launch, token_of, watch

pytestmark = pytest.mark.integration


def test_a_real_agents_samples_reach_the_right_socket_and_no_other(
    stack, tenant, other_tenant, make_member
):
    host = bring_up_host(stack, "gpu-host-1")
    # two tenants time-share gpu0 of the same host
    train = launch(host, tenant, "train", util=30.0)
    infer = launch(host, other_tenant, "infer", util=90.0)
    alice = token_of(make_member(tenant, Role.VIEWER, username="alice"))
    bob = token_of(make_member(other_tenant, Role.MEMBER, username="bob"))

    async def watch_all():
        return await asyncio.gather(
            watch(stack, f"/ws/instances/{train.pk}/metrics/", alice, 4.0),
            watch(stack, f"/ws/instances/{infer.pk}/metrics/", bob, 4.0),
            watch(stack, f"/ws/instances/{train.pk}/metrics/", bob, 4.0),  # the wrong tenant
            watch(stack, f"/ws/instances/{train.pk}/metrics/", "gpc_no_such_token", 1.0),
        )

    # (a thread of its own: after a browser test, this one holds Playwright's event loop)
    with ThreadPoolExecutor(1) as pool:
        mine, theirs, spy, stranger = pool.submit(asyncio.run, watch_all()).result()

    assert spy == {"refused": 403, "messages": []}
    assert stranger == {"refused": 403, "messages": []}
    for got, instance, util in ((mine, train, 30.0), (theirs, infer, 90.0)):
        assert got["refused"] is None
        kinds = [m["type"] for _, m in got["messages"]]
        assert kinds[0] == "window", kinds
        samples = [(at, m) for at, m in got["messages"] if m["type"] == "sample"]
        assert len(samples) >= 4, f"{len(samples)} samples in 4 s:\n{stack.logs()}"
        assert {m["instance"] for _, m in samples} == {instance.pk}
        assert all(abs(m["gpu_util"] - util) <= 2.5 for _, m in samples)  # its own load, ±2
        assert all(m["mem_total_mib"] == 20480 for _, m in samples)
        # Agent read → client received: the agent pushes each round as soon as it is read, so
        # a sample does not wait for a timer of the agent's (it waited up to a second).
        latencies = sorted(at - m["ts"] for at, m in samples)
        print(f"instance {instance.pk}: {len(samples)} samples, read→received "
              f"{latencies[0]:.3f}–{latencies[-1]:.3f} s")  # fmt: skip
        assert latencies[len(latencies) // 2] < 0.25, latencies
        assert latencies[-1] < 1.0, latencies
        timestamps = [m["ts"] for _, m in samples]
        assert timestamps == sorted(set(timestamps))  # in order, each once


def test_history_of_the_live_stack(stack, tenant, make_member, token_client):
    host = bring_up_host(stack, "gpu-host-2")
    train = launch(host, tenant, "train", util=60.0)
    client = token_client(make_member(tenant, Role.VIEWER, username="carol"))
    import httpx

    deadline = time.monotonic() + 10
    data = {}
    while time.monotonic() < deadline:
        response = httpx.get(
            f"{stack.url}/api/v1/instances/{train.pk}/metrics/?range=10m",
            headers={"Authorization": client._credentials["HTTP_AUTHORIZATION"]},
        )
        assert response.status_code == 200, response.text
        data = response.json()
        if len(data["ts"]) >= 3:
            break
        time.sleep(0.5)
    assert len(data["ts"]) >= 3
    assert all(abs(u - 60.0) <= 2.5 for u in data["gpu_util"])
