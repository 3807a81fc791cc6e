"""/ws/instances/{id}/terminal/: relayed to the agent's websocket (here a small websockets
server standing in for the agent, which tests/instances/test_ports.py's port websockets use
too) for members of the tenant; refused to viewers, other tenants, stopped instances, and when
the agent is away."""

import asyncio
import json
import re
import socket

import pytest
from channels.routing import URLRouter
from websockets.asyncio.server import serve

from accounts.roles import Role
from accounts.websocket import TenantAuthMiddleware
from agent import grants
from console import activity
from console.catalog.models import Mode
from console.instances.models import Allocation, State
from console.instances.routing import websocket_urlpatterns
from tests.instances.helpers import make_instance
from tests.instances.test_websocket import bearer, run
from tests.instances.wsclient import WebsocketCommunicator

pytestmark = pytest.mark.usefixtures("in_memory_layer", "no_tasks")


@pytest.fixture
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


AGENT_PATH = re.compile(r"/v1/instances/([0-9]+)/(?:terminal|ports/([0-9]+)/)")


class FakeAgent:
    """The agent's terminal and port websockets: echoes bytes, answers a resize, exits on
    b"exit", and records what it was asked. Only with a grant of that terminal or port."""

    def __init__(self, secret: str):
        self.key = grants.data_key(secret)
        self.requests: list[str] = []
        self.headers: list = []  # each request's
        self.texts: list[str] = []

    def _granted(self, request) -> bool:
        instance, port = AGENT_PATH.match(request.path).groups()
        scope = ("port", instance, int(port)) if port else ("terminal", instance)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        return scheme == "Grant" and grants.valid(self.key, scope, token)

    async def handler(self, ws):
        request = ws.request
        if not self._granted(request):
            await ws.close(4401)
            return
        self.requests.append(request.path)
        self.headers.append(request.headers)
        async for message in ws:
            if message == b"exit":
                await ws.close(1000)
                return
            if isinstance(message, str):
                self.texts.append(message)
                await ws.send("ok " + message)
            else:
                await ws.send(b"echo:" + message)

    def process_request(self, connection, request):
        if "/v1/instances/404/" in request.path:
            return connection.respond(404, "not found\n")
        return None


@pytest.fixture
def placed(catalog, tenant):
    port = free_port()
    host = catalog.host(gpus=1, mode=Mode.SHARED, address=f"http://127.0.0.1:{port}")
    instance = make_instance(catalog, tenant, state=State.RUNNING, name="shell")
    Allocation.objects.create(
        id=f"inst-{instance.pk}-a", instance=instance, host=host, mode="shared"
    )
    return instance, port, FakeAgent(f"secret-{host.name}")


APP = TenantAuthMiddleware(URLRouter(websocket_urlpatterns))


async def closed_with(communicator) -> int:
    connected, code = await communicator.connect()
    if not connected:
        return code
    message = await communicator.receive_output(timeout=3)
    assert message["type"] == "websocket.close"
    return message["code"]


def test_a_member_types_into_the_terminal_and_the_agent_answers(
    transactional_db, tenant, make_member, placed
):
    instance, port, agent = placed
    mia = make_member(tenant, Role.MEMBER, username="mia")
    headers = bearer(mia)

    async def scenario():
        async with serve(agent.handler, "127.0.0.1", port):
            path = f"/ws/instances/{instance.pk}/terminal/"
            browser = WebsocketCommunicator(APP, path, headers=headers)
            browser.scope["query_string"] = b"cols=120&rows=40"
            assert (await browser.connect(timeout=5))[0]
            await browser.send_input({"type": "websocket.receive", "bytes": b"ls\r"})
            answer = await browser.receive_output(timeout=3)
            assert answer["bytes"] == b"echo:ls\r"
            assert activity.seen(instance.pk)["terminal"][0] == 1  # the idle watch's signal
            resize = json.dumps({"type": "resize", "cols": 100, "rows": 30})
            await browser.send_input({"type": "websocket.receive", "text": resize})
            assert json.loads((await browser.receive_output(timeout=3))["text"][3:]) == {
                "type": "resize", "cols": 100, "rows": 30,
            }  # fmt: skip
            for junk in ("hello", '{"type": "resize", "cols": 0, "rows": 5}', "[1]"):
                await browser.send_input({"type": "websocket.receive", "text": junk})
            await browser.send_input({"type": "websocket.receive", "bytes": b"exit"})
            closing = await browser.receive_output(timeout=3)
            assert (closing["type"], closing["code"]) == ("websocket.close", 1000)
            await browser.send_input({"type": "websocket.disconnect", "code": 1000})
            await asyncio.sleep(0.2)
            await browser.wait(timeout=3)

    run(scenario)
    path = f"/v1/instances/{instance.pk}/terminal?cols=120&rows=40&member={mia.pk}"
    assert agent.requests == [path]  # the agent ends it when a push no longer names mia
    assert len(agent.texts) == 1  # the junk never reached the agent
    messages = list(instance.events.values_list("message", flat=True))
    assert "terminal session opened by mia" in messages
    assert "terminal session of mia ended" in messages
    open_now, last_used = activity.seen(instance.pk)["terminal"]
    assert open_now == 0 and last_used is not None


@pytest.mark.parametrize(
    ("who", "state", "code"),
    [
        ("viewer", State.RUNNING, 4403),
        ("stranger", State.RUNNING, 4404),
        ("member", State.STOPPED, 4409),
        ("nobody", State.RUNNING, 4404),
    ],
)
def test_refused(transactional_db, tenant, other_tenant, make_member, placed, who, state, code):
    instance, port, agent = placed
    instance.state = state
    instance.save()
    headers = {
        "viewer": lambda: bearer(make_member(tenant, Role.VIEWER)),
        "stranger": lambda: bearer(make_member(other_tenant, Role.OWNER)),
        "member": lambda: bearer(make_member(tenant, Role.MEMBER)),
        "nobody": lambda: [(b"origin", b"http://testserver")],  # no session, no token
    }[who]()

    async def scenario():
        async with serve(agent.handler, "127.0.0.1", port):
            path = f"/ws/instances/{instance.pk}/terminal/"
            assert await closed_with(WebsocketCommunicator(APP, path, headers=headers)) == code

    run(scenario)
    assert agent.requests == []
    assert not instance.events.filter(message__startswith="terminal").exists()


def test_an_agent_that_is_away_closes_the_terminal_with_4502(
    transactional_db, tenant, make_member, placed
):
    instance, _, _ = placed
    headers = bearer(make_member(tenant, Role.MEMBER))

    async def scenario():
        path = f"/ws/instances/{instance.pk}/terminal/"
        assert await closed_with(WebsocketCommunicator(APP, path, headers=headers)) == 4502

    run(scenario)


def test_an_open_terminal_closes_when_the_member_is_lowered_to_viewer(
    transactional_db, tenant, make_member, placed, monkeypatch
):
    from channels.db import database_sync_to_async

    from accounts import services as accounts_services
    from console.instances import relay

    monkeypatch.setattr(relay, "RECHECK_SECONDS", 0.05)
    instance, port, agent = placed
    member = make_member(tenant, Role.MEMBER)
    make_member(tenant, Role.OWNER)
    headers = bearer(member)

    async def scenario():
        async with serve(agent.handler, "127.0.0.1", port):
            path = f"/ws/instances/{instance.pk}/terminal/"
            browser = WebsocketCommunicator(APP, path, headers=headers)
            assert (await browser.connect(timeout=5))[0]
            await database_sync_to_async(accounts_services.change_role)(member, Role.VIEWER)
            closing = await browser.receive_output(timeout=3)
            assert (closing["type"], closing["code"]) == ("websocket.close", 4403)
            await browser.send_input({"type": "websocket.disconnect", "code": 4403})
            await browser.wait(timeout=3)

    run(scenario)


def test_a_terminal_whose_access_goes_while_its_agent_socket_opens_is_closed(
    transactional_db, tenant, make_member, placed
):
    """The console's push may reach the agent before this terminal does: the relay looks again
    once the agent's socket is open, and closes it (4403) without a session."""
    from channels.db import database_sync_to_async

    from accounts import services as accounts_services

    instance, port, agent = placed
    member = make_member(tenant, Role.MEMBER)
    make_member(tenant, Role.OWNER)
    lower = database_sync_to_async(accounts_services.change_role)
    headers = bearer(member)

    async def lowered_meanwhile(ws):
        await lower(member, Role.VIEWER)
        await agent.handler(ws)

    async def scenario():
        async with serve(lowered_meanwhile, "127.0.0.1", port):
            path = f"/ws/instances/{instance.pk}/terminal/"
            browser = WebsocketCommunicator(APP, path, headers=headers)
            assert await closed_with(browser) == 4403

    run(scenario)
    assert not instance.events.filter(message__contains="terminal session").exists()
