"""/ws/events/: a tenant's sockets get its instances' state changes; nobody else does."""

import threading

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.routing import URLRouter

from accounts import services as accounts
from accounts.roles import Role
from accounts.websocket import TenantAuthMiddleware
from console.instances import services
from console.instances.models import State
from console.instances.routing import websocket_urlpatterns
from tests.instances.helpers import make_instance
from tests.instances.wsclient import WebsocketCommunicator


@pytest.fixture
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def run(scenario) -> None:
    """Run the async scenario from a thread of its own: the session's Playwright browser may
    keep an event loop in this one, where async_to_sync refuses to run."""
    failure = []

    def target():
        try:
            async_to_sync(scenario)()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failure.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the websocket scenario did not finish"
    if failure:
        raise failure[0]


def bearer(membership) -> list[tuple[bytes, bytes]]:
    raw = accounts.issue_token(membership.user, membership.tenant, "ws").raw
    return [(b"authorization", f"Bearer {raw}".encode())]


@pytest.mark.usefixtures("in_memory_layer", "no_tasks")
def test_state_changes_reach_the_tenant_and_nobody_else(
    transactional_db, catalog, tenant, other_tenant, make_member
):
    mine = bearer(make_member(tenant, Role.VIEWER))
    theirs = bearer(make_member(other_tenant, Role.OWNER))
    instance = make_instance(catalog, tenant, state=State.RUNNING, name="watched")
    app = TenantAuthMiddleware(URLRouter(websocket_urlpatterns))

    async def scenario():
        ours = WebsocketCommunicator(app, "/ws/events/", headers=mine)
        other = WebsocketCommunicator(app, "/ws/events/", headers=theirs)
        assert (await ours.connect())[0]
        assert (await other.connect())[0]
        assert (await ours.receive_json_from())["type"] == "hello"
        assert (await other.receive_json_from())["tenant"] == "globex"

        await database_sync_to_async(services.stop_instance)(instance)

        message = await ours.receive_json_from(timeout=3)
        assert message["type"] == "instance.state"
        assert message["instance"]["id"] == instance.pk
        assert message["instance"]["name"] == "watched"
        assert (message["instance"]["from_state"], message["instance"]["state"]) == (
            "running",
            "stopping",
        )
        assert await other.receive_nothing(timeout=0.5)
        await ours.disconnect()
        await other.disconnect()

    run(scenario)


@pytest.mark.usefixtures("in_memory_layer")
def test_strangers_are_turned_away(transactional_db):
    app = TenantAuthMiddleware(URLRouter(websocket_urlpatterns))

    async def scenario():
        anonymous = WebsocketCommunicator(
            app,
            "/ws/events/",
            headers=[(b"origin", b"http://testserver"), (b"host", b"testserver")],
        )
        connected, code = await anonymous.connect()
        assert not connected and code == 4403
        forged = WebsocketCommunicator(
            app, "/ws/events/", headers=[(b"authorization", b"Bearer gpc_deadbeef_nope")]
        )
        connected, code = await forged.connect()
        assert not connected and code == 4403

    run(scenario)


@pytest.mark.parametrize("withdrawn", ["token", "membership"])
@pytest.mark.usefixtures("in_memory_layer", "no_tasks")
def test_an_open_socket_stops_when_its_access_is_withdrawn(
    transactional_db, catalog, tenant, make_member, monkeypatch, withdrawn
):
    from accounts import websocket

    monkeypatch.setattr(websocket, "RECHECK_SECONDS", 0.0)
    membership = make_member(tenant, Role.MEMBER)
    token = accounts.issue_token(membership.user, membership.tenant, "ws")
    headers = [(b"authorization", f"Bearer {token.raw}".encode())]
    first = make_instance(catalog, tenant, state=State.RUNNING, name="first")
    second = make_instance(catalog, tenant, state=State.RUNNING, name="second")
    app = TenantAuthMiddleware(URLRouter(websocket_urlpatterns))

    async def scenario():
        socket = WebsocketCommunicator(app, "/ws/events/", headers=headers)
        assert (await socket.connect())[0]
        await socket.receive_json_from()  # hello
        await database_sync_to_async(services.stop_instance)(first)
        assert (await socket.receive_json_from(timeout=3))["instance"]["name"] == "first"
        if withdrawn == "token":
            await database_sync_to_async(accounts.revoke_token)(token.token)
        else:
            await database_sync_to_async(accounts.remove_member)(membership)
        await database_sync_to_async(services.stop_instance)(second)
        assert (await socket.receive_output(timeout=3)) == {"type": "websocket.close", "code": 4403}

    run(scenario)
