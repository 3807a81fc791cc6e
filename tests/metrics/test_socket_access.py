"""Who may open a websocket and for how long (issue 12, findings 8 and 10): the Origin check
guards cookie sessions only, and an operator's socket ends when the operator does."""

import time

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model

from console.asgi import application
from tests.factories import UserFactory
from tests.metrics.communicator import WebsocketCommunicator, run
from tests.metrics.conftest import alloc_sample, gpu_sample
from tests.metrics.test_consumers import ingest_, receive, session_of, token_of

pytestmark = pytest.mark.django_db(transaction=True)


def handshake(path, origin=None, token=None, cookie=None):
    headers = [(b"host", b"testserver")]
    if origin:
        headers.append((b"origin", origin.encode()))
    if token:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    if cookie:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


@pytest.mark.parametrize("origin", [None, "https://elsewhere.example"])
@pytest.mark.parametrize("path", ["/ws/events/", "/ws/metrics/", "instance"])
def test_a_bearer_token_opens_a_socket_without_a_browser_origin(world, origin, path):
    """Scripts and CLIs send no Origin; a bearer token is never sent by a browser on its own."""
    token = token_of(world.alice)
    path = f"/ws/instances/{world.train.pk}/metrics/" if path == "instance" else path

    async def scenario():
        client = handshake(path, origin=origin, token=token)
        assert (await client.connect())[0]
        assert (await receive(client))["type"] in {"hello", "window"}
        await client.disconnect()

    run(scenario)


@pytest.mark.parametrize("origin", [None, "https://elsewhere.example"])
def test_a_cookie_session_still_needs_an_origin_of_this_site(world, origin):
    cookie = session_of(world.alice.user)

    async def scenario():
        hijack = handshake(f"/ws/instances/{world.train.pk}/metrics/", origin=origin, cookie=cookie)
        assert not (await hijack.connect())[0]
        await ingest_(world.host, [alloc_sample(time.time(), "alloc-train")])
        assert await hijack.receive_nothing(timeout=0.2)
        same_site = handshake(
            f"/ws/instances/{world.train.pk}/metrics/", origin="http://testserver", cookie=cookie
        )
        assert (await same_site.connect())[0]
        await same_site.disconnect()

    run(scenario)


def test_a_bad_bearer_token_without_origin_gets_nothing(world):
    async def scenario():
        spy = handshake("/ws/metrics/", token="gpc_00000000_wrong")
        assert not (await spy.connect())[0]

    run(scenario)


def _withdraw(user_id: int, change: str) -> None:
    field = {"loses staff": "is_staff", "deactivated": "is_active"}[change]
    get_user_model().objects.filter(pk=user_id).update(**{field: False})


@pytest.mark.parametrize("change", ["loses staff", "deactivated"])
@pytest.mark.parametrize("socket", ["fleet", "host"])
def test_an_operator_socket_closes_when_the_operator_goes(world, monkeypatch, change, socket):
    from accounts import websocket

    monkeypatch.setattr(websocket, "RECHECK_SECONDS", 0.0)
    operator = UserFactory(username="op", is_staff=True)
    cookie = session_of(operator)
    path = {"fleet": "/ws/fleet/metrics/", "host": f"/ws/fleet/hosts/{world.host.pk}/metrics/"}

    async def scenario():
        client = handshake(path[socket], origin="http://testserver", cookie=cookie)
        assert (await client.connect())[0]
        await receive(client)  # the fleet, or the host's window
        await ingest_(world.host, [gpu_sample(time.time(), 0, util=10.0)])
        assert (await receive(client))["samples"][0]["gpu_util"] == 10.0
        await database_sync_to_async(_withdraw)(operator.pk, change)
        await ingest_(world.host, [gpu_sample(time.time() + 1, 0, util=20.0)])
        closed = await client.receive_output(timeout=1)
        assert (closed["type"], closed.get("code")) == ("websocket.close", 4403)

    run(scenario)


def test_a_tenant_socket_closes_when_its_user_is_deactivated(world, monkeypatch):
    from accounts import websocket

    monkeypatch.setattr(websocket, "RECHECK_SECONDS", 0.0)
    cookie = session_of(world.alice.user)

    async def scenario():
        client = handshake(
            f"/ws/instances/{world.train.pk}/metrics/", origin="http://testserver", cookie=cookie
        )
        assert (await client.connect())[0]
        await receive(client)
        await database_sync_to_async(_withdraw)(world.alice.user_id, "deactivated")
        await ingest_(world.host, [alloc_sample(time.time(), "alloc-train")])
        closed = await client.receive_output(timeout=1)
        assert (closed["type"], closed.get("code")) == ("websocket.close", 4403)

    run(scenario)
