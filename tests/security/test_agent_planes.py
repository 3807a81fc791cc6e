"""The agent's two planes (README "The agent's two planes"): the host secret opens only the
control routes, a grant only the port or terminal it names, and a port's path is data all the
way to the container, whatever `..`, `%2e%2e`, `%2F`, backslashes or double encoding it holds.

Requests go out unnormalised: raw sockets for HTTP, `websockets` (which sends its target as
given) for websockets."""

import asyncio
import json
import re
import socket
import threading
import time
import unicodedata
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote, unquote

import asyncssh
import httpx
import pytest
import uvicorn
import websockets
from hypothesis import given
from hypothesis import strategies as st
from starlette.routing import WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect
from websockets.typing import Subprotocol

from agent.api import create_app
from agent.errors import ApiError
from agent.identity import HostSecret
from console.fleet import agent_client
from tests.agent.agents import SECRET, free_port, standalone

SHARED_QUARTER = {"mode": "shared", "gpus": [2], "shared": {"milli": 250, "memory_mib": 20480}}
VICTIM_KEY, ATTACKER_KEY = (
    asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    for _ in range(2)
)
PORT = "/v1/instances/6/ports/8888/"


def grant(*scope, secret: str = SECRET, seconds: int = 60) -> dict[str, str]:
    token = agent_client.mint_grant(secret, scope, int(time.time()) + seconds)
    return {"Authorization": f"Grant {token}"}


PORT_GRANT = ("port", "6", 8888)
BEARER = {"Authorization": f"Bearer {SECRET}"}


def raw_request(port: int, method: str, target: str, headers: dict, body: bytes = b""):
    """(status, body) of one HTTP/1.1 request whose target goes on the wire byte for byte."""
    head = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    head += [f"Content-Length: {len(body)}", "", ""]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall("\r\n".join(head).encode("latin-1") + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        chunks = b""
        while (size := int(body.partition(b"\r\n")[0], 16)) > 0:
            start = body.index(b"\r\n") + 2
            chunks, body = chunks + body[start : start + size], body[start + size + 2 :]
        body = chunks
    return int(head.split()[1]), body


# --- a real agent process: grants against the control plane --------------------------------


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    """A standalone sim agent with another tenant's instance 5: its keys and allocation."""
    state = tmp_path_factory.mktemp("planes") / "state"
    with standalone(state, "--gpus", "4", "--mode", "mig,mig,shared,whole") as agent:
        keys = {"keys": [{"name": "victim", "public_key": VICTIM_KEY}]}
        assert agent.client.put("/v1/instances/5/ssh-keys", json=keys).status_code == 200
        created = agent.client.put("/v1/allocations/victim-a", json=SHARED_QUARTER)
        assert created.status_code == 201, created.text
        yield agent


def _untouched(agent) -> None:
    listed = agent.client.get("/v1/allocations").json()["allocations"]
    assert [(a["id"], a["state"]) for a in listed] == [("victim-a", "running")]
    keys = json.loads((agent.state_dir / "ssh_keys.json").read_text())
    assert [k["public_key"] for k in keys["5"]] == [VICTIM_KEY]


ATTACKER_KEYS = json.dumps({"keys": [{"name": "x", "public_key": ATTACKER_KEY}]}).encode()
TRAVERSALS = [
    ("GET", "../../../../allocations", b""),
    ("GET", "%2e%2e/%2e%2e/%2e%2e/%2e%2e/allocations", b""),
    ("GET", "%2E%2E/%2E%2E/%2E%2E/%2E%2E/inventory", b""),
    ("GET", "..%2f..%2f..%2f..%2fallocations", b""),
    ("GET", "%2F..%2F..%2F..%2F..%2Finventory", b""),
    ("GET", "..\\..\\..\\..\\allocations", b""),
    ("GET", "..%5c..%5c..%5c..%5callocations", b""),
    ("GET", "%252e%252e/%252e%252e/%252e%252e/%252e%252e/allocations", b""),
    ("PUT", "../../../5/ssh-keys", ATTACKER_KEYS),
    ("PUT", "%2e%2e/%2e%2e/%2e%2e/5/ssh-keys", ATTACKER_KEYS),
    ("POST", "../../../../allocations/victim-a/stop", b""),
    ("DELETE", "..%2F..%2F..%2F..%2Fallocations/victim-a", b""),
    ("PUT", "../../../../allocations/rogue-1", json.dumps(SHARED_QUARTER).encode()),
]


@pytest.mark.integration
@pytest.mark.parametrize(("method", "rest", "body"), TRAVERSALS)
def test_a_port_grant_never_reaches_a_control_route(agent, method, rest, body):
    status, answer = raw_request(agent.port, method, PORT + rest, grant(*PORT_GRANT), body)
    # the port's own route (no containers on a sim host: 409), or refused outright
    assert status in (400, 401, 404, 409), (status, answer)
    assert b"victim" not in answer and b"allocations" not in answer
    _untouched(agent)


@pytest.mark.integration
@pytest.mark.parametrize(("method", "rest", "body"), TRAVERSALS)
def test_the_host_secret_opens_no_port_route(agent, method, rest, body):
    status, answer = raw_request(agent.port, method, PORT + rest, BEARER, body)
    assert status in (400, 401), (status, answer)
    _untouched(agent)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("GET", "/v1/allocations"),
        ("GET", "/v1/inventory"),
        ("PUT", "/v1/instances/5/ssh-keys"),
        ("PUT", "/v1/instances/6/ssh-keys"),
        ("POST", "/v1/allocations/victim-a/stop"),
        ("PUT", "/v1/allocations/rogue-1"),
        ("GET", "/v1/instances/6/logs"),
        ("DELETE", "/v1/instances/5"),
    ],
)
def test_a_grant_is_no_control_credential(agent, method, target):
    body = ATTACKER_KEYS if target.endswith("ssh-keys") else b""
    for headers in (grant(*PORT_GRANT), grant("terminal", "6"), grant("terminal", "5")):
        status, answer = raw_request(agent.port, method, target, headers, body)
        assert status == 401, (target, answer)
        assert json.loads(answer)["error"] == "unauthorized"
    _untouched(agent)


@pytest.mark.integration
def test_a_grant_opens_exactly_its_instance_and_port(agent):
    def status(headers, target=PORT + "lab") -> int:
        return raw_request(agent.port, "GET", target, headers)[0]

    assert status(grant(*PORT_GRANT)) == 409  # through: the sim host has no containers
    assert status(grant(*PORT_GRANT), "/v1/instances/6/ports/8888/") == 409
    tampered = grant(*PORT_GRANT)["Authorization"]
    tampered = tampered[:-1] + ("0" if tampered[-1] != "0" else "1")
    for refused in (
        {},
        BEARER,
        {"Authorization": f"Grant {SECRET}"},
        grant("port", "6", 8889),
        grant("port", "5", 8888),
        grant("port", "66", 8888),
        grant("terminal", "6"),
        grant(*PORT_GRANT, seconds=-1),
        grant(*PORT_GRANT, secret="another host's secret"),
        {"Authorization": tampered},
        {"Authorization": grant(*PORT_GRANT)["Authorization"].replace("Grant", "Bearer")},
    ):
        assert status(refused) == 401, refused
    assert status(grant(*PORT_GRANT), "/v1/instances/6/ports/8889/lab") == 401
    assert status(grant(*PORT_GRANT), "/v1/instances/5/ports/8888/lab") == 401


async def _close_code(url: str, headers: dict) -> int | str:
    """The close code of a websocket the agent opened, or 'refused' when it did not open."""
    try:
        async with websockets.connect(url, additional_headers=headers) as ws:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
            return closed.value.rcvd.code
    except websockets.InvalidStatus:
        return "refused"


@pytest.mark.integration
def test_websockets_take_only_their_own_grant(agent):
    base = f"ws://127.0.0.1:{agent.port}"

    def code(path: str, headers: dict):
        return asyncio.run(_close_code(base + path, headers))

    terminal = "/v1/instances/6/terminal"
    assert code(terminal, grant("terminal", "6")) == 4409  # opened: no containers here
    for refused in (
        {},
        BEARER,
        grant(*PORT_GRANT),
        grant("terminal", "5"),
        grant("terminal", "6", seconds=-1),
        grant("terminal", "6", secret="another host's secret"),
    ):
        assert code(terminal, refused) == "refused", refused
    for path in (
        PORT + "../../terminal",
        PORT + "%2e%2e/%2e%2e/terminal",
        PORT + "..%2F..%2Fterminal",
        PORT + "../../../5/terminal",
    ):
        for headers in (grant(*PORT_GRANT), BEARER):
            assert code(path, headers) == "refused", (path, headers)


# --- the port proxy: the path is data down to the container (in-process agent app) ----------


class _StubHost:
    """Instance 6's container is loopback: the port proxy reaches `Upstream` there."""

    backend = SimpleNamespace(name="stub")
    stop = start = reboot = None  # control routes, never called here
    store = SimpleNamespace(root=Path("/nonexistent"))  # no snapshot job runs here

    def __init__(self):
        self.runtime = SimpleNamespace(
            running_container=lambda alloc: alloc, container_address=lambda c: "127.0.0.1"
        )
        self.key_listeners = []

    def running_allocation(self, instance: str):
        if instance != "6":
            raise ApiError(404, "not_running", f"instance {instance} is not running here")
        return instance


class Upstream:
    """The container's server: answers (and, for websockets, first sends) the raw target it
    received; at /headers, its Host, Origin and Cookie headers (JSON). A websocket is accepted
    with the first subprotocol offered."""

    async def __call__(self, scope, receive, send):
        target = scope["raw_path"] + (
            b"?" + scope["query_string"] if scope["query_string"] else b""
        )
        if scope["raw_path"] == b"/headers":
            kept = {b"host", b"origin", b"cookie", b"x-forwarded-host"}
            seen = {k.decode(): v.decode() for k, v in scope["headers"] if k in kept}
            target = json.dumps(seen).encode()
        if scope["type"] == "websocket":
            await receive()
            chosen = (scope["subprotocols"] or [None])[0]
            await send({"type": "websocket.accept", "subprotocol": chosen})
            await send({"type": "websocket.send", "bytes": target})
            await send({"type": "websocket.close", "code": 1000})
        elif scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": target})


def _serve(app):
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    return server, thread, port


@pytest.fixture(scope="module")
def proxied():
    """(agent app's port, container port) with the agent app's port proxy in front."""
    upstream = _serve(Upstream())
    agent_app = _serve(create_app(_StubHost(), HostSecret(SECRET)))
    yield agent_app[2], upstream[2]
    for server, thread, _ in (agent_app, upstream):
        server.should_exit = True
        thread.join(timeout=5)


@pytest.mark.parametrize(
    ("rest", "seen"),
    [
        ("", b"/"),
        ("a/b/", b"/a/b/"),
        ("../../../../allocations", b"/%2E%2E/%2E%2E/%2E%2E/%2E%2E/allocations"),
        ("%2e%2e/./x", b"/%2E%2E/%2E/x"),
        ("%252e%252e/x", b"/%252e%252e/x"),
        ("lab/tree?a=1&b=/../c", b"/lab/tree?a=1&b=/../c"),
        ("a%20b/caf%C3%A9", b"/a%20b/caf%C3%A9"),
    ],
)
def test_the_port_path_reaches_the_container_as_data(proxied, rest, seen):
    agent_port, port = proxied
    target = f"/v1/instances/6/ports/{port}/{rest}"
    status, body = raw_request(agent_port, "GET", target, grant("port", "6", port))
    assert (status, body) == (200, seen)


def test_a_port_websocket_opens_with_its_grant_only(proxied):
    agent_port, port = proxied
    url = f"ws://127.0.0.1:{agent_port}/v1/instances/6/ports/{port}/api/../kernels?x=1"

    async def first(headers):
        async with websockets.connect(url, additional_headers=headers) as ws:
            return await asyncio.wait_for(ws.recv(), 10)

    assert asyncio.run(first(grant("port", "6", port))) == b"/api/%2E%2E/kernels?x=1"
    for refused in (BEARER, grant("port", "6", port + 1), grant("terminal", "6"), {}):
        with pytest.raises(websockets.InvalidStatus):
            asyncio.run(first(refused))


def test_the_container_sees_the_browsers_host_origin_cookies_and_subprotocol(proxied):
    agent_port, port = proxied
    target = f"/v1/instances/6/ports/{port}/headers"
    browser = "i6-8888.ports.localhost:8000"
    sent = {"Origin": f"http://{browser}", "Cookie": "_xsrf=x; username-a=b"}

    def over_http(forwarded: str) -> dict:
        headers = {**grant("port", "6", port), **sent, "X-Forwarded-Host": forwarded}
        status, body = raw_request(agent_port, "GET", target, headers)
        assert status == 200
        return json.loads(body)

    async def first(forwarded: str) -> dict:
        headers = {**grant("port", "6", port), **sent, "X-Forwarded-Host": forwarded}
        url = f"ws://127.0.0.1:{agent_port}{target}"
        offered = [Subprotocol("v1.kernel.websocket.jupyter.org")]
        async with websockets.connect(url, additional_headers=headers, subprotocols=offered) as ws:
            assert ws.subprotocol == offered[0]  # the container's server's choice
            return json.loads(await asyncio.wait_for(ws.recv(), 10))

    as_sent = {**{k.lower(): v for k, v in sent.items()}, "host": browser}
    assert over_http(browser) == {**as_sent, "x-forwarded-host": browser}
    assert asyncio.run(first(browser)) == as_sent
    for bad in ("evil.example/x", "a b", "@evil", "h:1:2", "-x"):
        assert over_http(bad)["host"] == f"127.0.0.1:{port}", bad
        assert asyncio.run(first(bad))["host"] == f"127.0.0.1:{port}", bad


def test_the_consoles_port_request_reaches_only_the_port(proxied):
    agent_port, port = proxied
    host = SimpleNamespace(name="h", address=f"http://127.0.0.1:{agent_port}", secret=SECRET)

    async def fetch(path: str, query: str = "") -> bytes:
        response = await agent_client.port_request(
            host, 6, port, path, query=query, method="GET", headers=[], content=b""
        )
        try:
            return await response.aread()
        finally:
            await response.aclose()

    assert asyncio.run(fetch("a/%252e%252e/b/", "q=/../x")) == b"/a/%252e%252e/b/?q=/../x"
    assert asyncio.run(fetch("")) == b"/"
    for attack in ("../../../../allocations", "%2e%2e/x", "..%2fx", "a%2Fb", "a%5Cb", "%00"):
        with pytest.raises(agent_client.PortPathRefused):
            asyncio.run(fetch(attack))


# --- agent_client: the port's target names exactly the segments given ----------------------

PREFIX = "/v1/instances/6/ports/8888/"
DOT_OR_SEPARATOR = [".", "..", "%2e", "%2E%2e", ".%2E", "a%2Fb", "%2f", "a\\b", "%5C", "%00",
                    "a%0Ab", "%7f", "%C2%85"]  # fmt: skip
segment_text = st.text().filter(
    lambda s: (
        s not in (".", "..") and not any(c in "/\\" or unicodedata.category(c) == "Cc" for c in s)
    )
)


@given(
    segments=st.lists(segment_text, min_size=1, max_size=6),
    safe=st.sampled_from(["", "!$&'()*+,;=:@"]),
)
def test_the_target_has_exactly_the_segments_given(segments, safe):
    target = agent_client.port_target(6, 8888, "/".join(quote(s, safe=safe) for s in segments), "")
    assert target.startswith(PREFIX)
    assert [unquote(s) for s in target[len(PREFIX) :].split("/")] == segments
    url = httpx.URL("http://agent:9101").copy_with(raw_path=target.encode())
    assert url.raw_path == target.encode()  # nothing normalised on the way out


@given(
    before=st.lists(segment_text, max_size=3),
    bad=st.sampled_from(DOT_OR_SEPARATOR),
    after=st.lists(segment_text, max_size=3),
)
def test_dot_and_separator_segments_are_refused(before, bad, after):
    path = "/".join(
        [*(quote(s, safe="") for s in before), bad, *(quote(s, safe="") for s in after)]
    )
    with pytest.raises(agent_client.PortPathRefused):
        agent_client.port_target(6, 8888, path, "")


def test_the_query_goes_as_sent_unless_no_url_may_hold_it():
    target = agent_client.port_target(6, 8888, "a/", "x=%2F..&y=/../z")
    assert target == PREFIX + "a/?x=%2F..&y=/../z"
    for query in ("a b", "a#b", "a\r\nb", "é"):
        with pytest.raises(agent_client.PortPathRefused):
            agent_client.port_target(6, 8888, "", query)


def _sample_path(route) -> str:
    """The route's path with a value in each parameter (`{port:int}` → 8888)."""
    return re.sub(
        r"\{(\w+)(?::(\w+))?\}",
        lambda m: "8888" if m[2] == "int" else ("x/y" if m[2] == "path" else "6"),
        route.path,
    )


def test_every_route_but_health_asks_for_a_credential():
    """A route added without its plane's guard would be open to anyone who reaches the
    agent: every route, present and future, refuses a request with no credential and with a
    grant for what it is not."""
    app = create_app(_StubHost(), HostSecret(SECRET))
    client = TestClient(app)
    checked = 0
    for route in app.routes:
        path = _sample_path(route)
        if path == "/v1/healthz":
            continue
        for headers in ({}, grant("port", "5", 1)):
            if isinstance(route, WebSocketRoute):
                with (
                    pytest.raises(WebSocketDisconnect) as closed,
                    client.websocket_connect(path, headers=headers) as ws,
                ):
                    ws.receive()
                assert closed.value.code == 4401, (path, headers)
            else:
                method = sorted(route.methods - {"HEAD"})[0]
                answer = client.request(method, path, headers=headers)
                assert answer.status_code == 401, (method, path, headers, answer.text)
        checked += 1
    assert checked >= 14
