"""The websockets, driven through the real ASGI application (auth middleware, origin check,
routing) with the in-process channel layer: the right socket gets each sample, nobody else."""

import asyncio
import json
import threading
import time

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.test import Client

from accounts import services
from console.asgi import application
from console.metrics import ingest
from tests.factories import UserFactory
from tests.metrics.communicator import WebsocketCommunicator, run
from tests.metrics.conftest import alloc_sample, gpu_sample

# channels' database_sync_to_async closes the connection around each call: committed data only.
pytestmark = pytest.mark.django_db(transaction=True)


def socket(path, token=None, cookie=None):
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if token:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    if cookie:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


def token_of(membership) -> str:
    return services.issue_token(membership.user, membership.tenant, "ws").raw


def session_of(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


async def receive(communicator, timeout=1):
    return json.loads(await communicator.receive_from(timeout=timeout))


ingest_ = database_sync_to_async(ingest.ingest_samples)


def test_each_tenant_gets_its_own_slice_of_a_shared_gpu(world):
    alice, bob = token_of(world.alice), token_of(world.bob)

    async def scenario():
        train = socket(f"/ws/instances/{world.train.pk}/metrics/", token=alice)
        infer = socket(f"/ws/instances/{world.infer.pk}/metrics/", token=bob)
        assert (await train.connect())[0] and (await infer.connect())[0]
        assert await receive(train) == {
            "type": "window",
            "instance": world.train.pk,
            "window_seconds": 600,
            "samples": [],
        }
        assert (await receive(infer))["samples"] == []
        now = time.time()
        await ingest_(
            world.host,
            [
                gpu_sample(now, 0, util=80.0),
                alloc_sample(now, "alloc-train", util=30.0, mem_used_mib=4096, power_w=55.5),
                alloc_sample(now, "alloc-infer", util=90.0),
            ],
        )
        assert await receive(train) == {
            "type": "sample",
            "instance": world.train.pk,
            "ts": now,
            "gpu_util": 30.0,
            "mem_used_mib": 4096,
            "mem_total_mib": 20480,
            "temperature_c": 60.0,
            "power_w": 55.5,
        }
        assert (await receive(infer))["gpu_util"] == 90.0
        assert await train.receive_nothing(timeout=0.3)
        assert await infer.receive_nothing(timeout=0.1)
        await train.disconnect()
        await infer.disconnect()

    run(scenario)


def test_the_recent_window_comes_first_then_only_new_samples(world):
    alice = token_of(world.alice)
    now = time.time()
    ingest.ingest_samples(
        world.host, [alloc_sample(now - 3 + n, "alloc-train", util=n) for n in range(3)]
    )

    async def scenario():
        train = socket(f"/ws/instances/{world.train.pk}/metrics/", token=alice)
        assert (await train.connect())[0]
        window = await receive(train)
        assert [s["gpu_util"] for s in window["samples"]] == [0, 1, 2]
        assert set(window["samples"][0]) == {
            "ts", "gpu_util", "mem_used_mib", "mem_total_mib", "temperature_c", "power_w",
        }  # fmt: skip
        # a retry of an old batch and a new sample: only the new one goes out
        await ingest_(
            world.host,
            [
                alloc_sample(now - 1, "alloc-train", util=2),
                alloc_sample(now, "alloc-train", util=7),
            ],
        )
        assert (await receive(train))["gpu_util"] == 7
        assert await train.receive_nothing(timeout=0.2)
        await train.disconnect()

    run(scenario)


@pytest.mark.parametrize("who", ["other tenant", "nobody", "bad token", "no such instance"])
def test_a_socket_that_may_not_see_is_refused_without_a_sample(world, who):
    token = {
        "other tenant": token_of(world.bob),
        "nobody": None,
        "bad token": "gpc_nope_nope",
        "no such instance": token_of(world.alice),
    }[who]
    pk = world.train.pk + 999 if who == "no such instance" else world.train.pk

    async def scenario():
        spy = socket(f"/ws/instances/{pk}/metrics/", token=token)
        connected, _ = await spy.connect()
        assert not connected
        await ingest_(world.host, [alloc_sample(time.time(), "alloc-train")])
        assert await spy.receive_nothing(timeout=0.2)

    run(scenario)


def test_a_browser_session_works_too(world):
    cookie = session_of(world.alice.user)

    async def scenario():
        train = socket(f"/ws/instances/{world.train.pk}/metrics/", cookie=cookie)
        assert (await train.connect())[0]
        assert (await receive(train))["type"] == "window"
        await ingest_(world.host, [alloc_sample(time.time(), "alloc-train", util=12.0)])
        assert (await receive(train))["gpu_util"] == 12.0
        await train.disconnect()

        spy = socket(f"/ws/instances/{world.infer.pk}/metrics/", cookie=cookie)
        assert not (await spy.connect())[0]

    run(scenario)


def test_the_tenant_socket_gets_every_instance_of_its_tenant_only(world):
    alice = token_of(world.alice)

    async def scenario():
        tenant = socket("/ws/metrics/", token=alice)
        assert (await tenant.connect())[0]
        assert await receive(tenant) == {"type": "hello", "tenant": "acme"}
        now = time.time()
        await ingest_(
            world.host, [alloc_sample(now, "alloc-train"), alloc_sample(now, "alloc-infer")]
        )
        await ingest_(world.host_b, [alloc_sample(now, "alloc-big", host="host-b")])
        got = {(await receive(tenant))["instance"], (await receive(tenant))["instance"]}
        assert got == {world.train.pk, world.big.pk}
        assert await tenant.receive_nothing(timeout=0.2)
        await tenant.disconnect()

    run(scenario)


def test_the_fleet_socket_is_for_operators(world):
    operator = session_of(UserFactory(username="op", is_staff=True))
    tenant_user = session_of(world.alice.user)

    async def scenario():
        refused = socket("/ws/fleet/metrics/", cookie=tenant_user)
        assert not (await refused.connect())[0]

        fleet = socket("/ws/fleet/metrics/", cookie=operator)
        assert (await fleet.connect())[0]
        hello = await receive(fleet)
        assert hello["type"] == "fleet"
        assert [h["name"] for h in hello["hosts"]] == ["host-a", "host-b"]
        now = time.time()
        await ingest_(
            world.host,
            [gpu_sample(now, 0, util=10.0), gpu_sample(now, 1, util=20.0, healthy=False)],
        )
        await ingest_(world.host_b, [gpu_sample(now, 0, host="host-b", util=30.0)])
        first, second = await receive(fleet), await receive(fleet)
        assert (first["type"], first["host"]) == ("gpus", world.host.pk)
        assert [(s["gpu"], s["gpu_util"], s["healthy"]) for s in first["samples"]] == [
            (0, 10.0, True),
            (1, 20.0, False),
        ]
        assert second["host"] == world.host_b.pk
        await fleet.disconnect()

        host = socket(f"/ws/fleet/hosts/{world.host.pk}/metrics/", cookie=operator)
        assert (await host.connect())[0]
        window = await receive(host)
        assert window["type"] == "window"
        assert [s["gpu_util"] for s in window["gpus"]["0"]] == [10.0]
        await ingest_(world.host_b, [gpu_sample(now + 1, 0, host="host-b")])  # not this host
        await ingest_(world.host, [gpu_sample(now + 1, 0, util=11.0)])
        assert (await receive(host))["samples"][0]["gpu_util"] == 11.0
        assert await host.receive_nothing(timeout=0.2)
        await host.disconnect()

        refused = socket(f"/ws/fleet/hosts/{world.host.pk}/metrics/", cookie=tenant_user)
        assert not (await refused.connect())[0]

    run(scenario)


@pytest.mark.parametrize("revoke", ["token", "membership"])
def test_an_open_socket_stops_when_its_access_is_withdrawn(world, monkeypatch, revoke):
    from accounts import websocket
    from accounts.models import ApiToken

    monkeypatch.setattr(websocket, "RECHECK_SECONDS", 0.0)
    alice = token_of(world.alice)

    async def scenario():
        train = socket(f"/ws/instances/{world.train.pk}/metrics/", token=alice)
        assert (await train.connect())[0]
        await receive(train)  # the window
        await ingest_(world.host, [alloc_sample(time.time(), "alloc-train", util=10.0)])
        assert (await receive(train))["gpu_util"] == 10.0
        if revoke == "token":
            await database_sync_to_async(
                lambda: services.revoke_token(ApiToken.objects.get(name="ws"))
            )()
        else:
            await database_sync_to_async(services.remove_member)(world.alice)
        await ingest_(world.host, [alloc_sample(time.time() + 1, "alloc-train", util=20.0)])
        assert (await train.receive_output(timeout=1))["type"] == "websocket.close"

    run(scenario)


def test_a_sample_is_relayed_while_the_shared_database_thread_is_busy(world):
    """Each frame goes straight to its socket: it does not queue for the one thread that every
    socket's database calls share (held here by a slow one)."""
    alice = token_of(world.alice)

    async def scenario():
        train = socket(f"/ws/instances/{world.train.pk}/metrics/", token=alice)
        assert (await train.connect())[0]
        await receive(train)  # the window
        held = threading.Event()
        slow = asyncio.ensure_future(sync_to_async(held.wait)())  # the shared thread, busy
        sample = {"type": "sample", "instance": world.train.pk, "ts": time.time(), "gpu_util": 5}
        try:
            await get_channel_layer().group_send(
                ingest.instance_group(world.train.pk),
                {"type": "metrics.frames", "frames": [[sample["ts"], json.dumps(sample)]]},
            )
            assert await receive(train) == sample
        finally:
            held.set()
            await slow

    run(scenario)
