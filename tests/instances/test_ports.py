"""An instance's web port on its own origin (i{id}-{port}.PORTS_DOMAIN), against a stand-in
agent (uvicorn on loopback): the console's grant and the origin's cookie, what reaches the
agent (a grant of that port, never the host secret, the console's cookies or token, nor the
origin's cookie), what comes back, and every refusal — HTML for browsers, JSON for API
clients. Requests are raw ASGI calls, so that paths go as sent (no client normalizes them)."""

import asyncio
import json
import socket
import threading
import time
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest
import uvicorn
from django.core import signing
from django.test import Client
from websockets.asyncio.server import serve

from accounts.roles import Role
from agent import grants
from console.catalog.models import Mode
from console.instances import port_origin
from console.instances.models import Allocation, State
from console.instances.ports import by_host
from tests.instances.helpers import make_instance
from tests.instances.test_terminal import FakeAgent
from tests.instances.test_websocket import bearer, run
from tests.instances.wsclient import WebsocketCommunicator

pytestmark = pytest.mark.usefixtures("no_tasks")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandInAgent:
    """Answers /v1/instances/{pk}/ports/{port}/… with what it received; for port 9000 what
    the agent says when nothing listens there; /cookies sets the app's cookies."""

    def __init__(self):
        self.seen: list[dict] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.seen.append(
            {"path": scope["raw_path"].decode(), "query": scope["query_string"], **headers}
        )
        extra = []
        if "/ports/9000/" in scope["path"]:
            status, kind = 502, b"application/json"
            answer = b'{"error": "port_unreachable", "detail": "nothing answers"}'
        else:
            status, kind = 200, b"text/plain"
            answer = b"jupyter says " + scope["method"].encode() + b" " + body
        if scope["path"].endswith("/cookies"):
            extra = [
                (b"set-cookie", b"theme=dark; Domain=ports.localhost; Path=/"),
                (b"set-cookie", b"gpucloud-port=forged; Path=/"),
                (b"set-cookie", b"sessionid=evil; path=/; domain=localhost; HttpOnly"),
                (b"connection", b"close"),
            ]
        length = str(len(answer)).encode()
        headers = [(b"content-type", kind), (b"content-length", length), (b"x-app", b"jupyter")]
        headers += extra
        await send({"type": "http.response.start", "status": status, "headers": headers})
        for part in (answer[:5], answer[5:]):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


@pytest.fixture
def agent():
    port = free_port()
    fake = StandInAgent()
    server = uvicorn.Server(uvicorn.Config(fake, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    fake.port = port
    yield fake
    server.should_exit = True
    thread.join(timeout=5)


@pytest.fixture
def jupyter(catalog, tenant, agent):
    host = catalog.host(gpus=1, mode=Mode.SHARED, address=f"http://127.0.0.1:{agent.port}")
    catalog.image.ports = [{"port": 8888, "name": "Jupyter"}]
    catalog.image.save()
    instance = make_instance(
        catalog, tenant, state=State.RUNNING, name="nb", ports=[{"port": 9000, "name": "app"}]
    )
    Allocation.objects.create(
        id=f"inst-{instance.pk}-a", instance=instance, host=host, mode="shared"
    )
    instance.host = host
    return instance


class Answer:
    def __init__(self, status: int, headers: list, body: bytes):
        self.status_code = status
        self.raw_headers = headers
        self.headers = {k.decode(): v.decode() for k, v in headers}
        self.content = body
        self.text = body.decode()

    def json(self):
        return json.loads(self.content)

    def all(self, name: str) -> list[str]:
        return [v.decode() for k, v in self.raw_headers if k.decode() == name]


def origin(pk: int, port: int = 8888) -> str:
    return f"i{pk}-{port}.ports.localhost"


def fetch(host: str, method: str, target: str, headers=(), body: bytes = b"") -> Answer:
    """One request to the ASGI app as a server hands it over: `target` as sent (raw)."""
    from console.asgi import django_app

    raw_path, _, query = target.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(raw_path),
        "raw_path": raw_path.encode(),
        "query_string": query.encode(),
        "headers": [(b"host", host.encode())]
        + [(k.lower().encode(), v.encode()) for k, v in headers]
        + ([(b"content-length", str(len(body)).encode())] if body else []),
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    messages = []

    async def scenario():
        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            if pending:
                return pending.pop()
            await asyncio.Event().wait()

        async def send(message):
            messages.append(message)

        await by_host(django_app)(scope, receive, send)

    run(scenario)
    start = messages[0]
    content = b"".join(m.get("body", b"") for m in messages[1:])
    return Answer(start["status"], start["headers"], content)


def auth(membership) -> list[tuple[str, str]]:
    return [(k.decode(), v.decode()) for k, v in bearer(membership)]


def signed_in(membership) -> Client:
    browser = Client()
    browser.force_login(membership.user)
    return browser


def grant_for(membership, pk: int, port: int = 8888, path: str = "/") -> dict:
    """What the console's link hands a signed-in member: the grant URL's parts."""
    answer = signed_in(membership).get(f"/instances/{pk}/ports/{port}{path}")
    assert answer.status_code == 302, answer.content
    location = urlsplit(answer["Location"])
    return {"host": location.netloc, "target": f"{location.path}?{location.query}"}


def cookie_of(answer: Answer) -> str:
    (cookie,) = answer.all("set-cookie")
    return cookie.split(";")[0]


def session(membership, pk: int, port: int = 8888) -> str:
    """The port origin's cookie, from a grant redeemed as a browser does."""
    grant = grant_for(membership, pk, port)
    return cookie_of(fetch(grant["host"], "GET", grant["target"]))


def test_the_consoles_link_leads_to_the_port_origin_and_the_app_gets_its_own_cookies_only(
    transactional_db, tenant, make_member, jupyter, agent
):
    member = make_member(tenant, Role.MEMBER)
    grant = grant_for(member, jupyter.pk, path="/lab/tree?a=1")
    assert grant["host"] == origin(jupyter.pk)
    assert grant["target"].startswith("/.gpucloud/grant?g=")
    assert parse_qs(urlsplit(grant["target"]).query)["next"] == ["/lab/tree?a=1"]

    taken = fetch(grant["host"], "GET", grant["target"])
    assert taken.status_code == 302 and taken.headers["location"] == "/lab/tree?a=1"
    (cookie,) = taken.all("set-cookie")
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert cookie.startswith("gpucloud-port=")
    assert attributes == {"gpucloud-port", "path", "httponly", "samesite", "max-age"}
    assert "SameSite=Lax" in cookie and "Path=/" in cookie  # host-only: no Domain
    assert "frame-ancestors 'none'" in taken.headers["content-security-policy"]

    cookies = f"theme=dark; {cookie.split(';')[0]}; sessionid=console-session"
    sent = [("cookie", cookies), ("x-forwarded-host", "evil.example")]
    answer = fetch(grant["host"], "GET", "/lab/tree?a=1", sent)
    assert answer.status_code == 200 and answer.text == "jupyter says GET "
    assert answer.headers["x-app"] == "jupyter"
    assert "content-security-policy" not in answer.headers  # the console's CSP is not the app's
    seen = agent.seen[-1]
    assert seen["path"] == f"/v1/instances/{jupyter.pk}/ports/8888/lab/tree"
    assert seen["query"] == b"a=1"
    scheme, _, token = seen["authorization"].partition(" ")  # a grant of that port, no secret
    key = grants.data_key(f"secret-{jupyter.host.name}")
    assert scheme == "Grant" and grants.valid(key, ("port", str(jupyter.pk), 8888), token)
    assert not grants.valid(key, ("port", str(jupyter.pk), 9000), token)
    assert seen["cookie"] == "theme=dark; sessionid=console-session"  # the app's own, as sent
    assert (seen["x-forwarded-host"], seen["x-forwarded-proto"]) == (grant["host"], "http")
    assert "transfer-encoding" not in seen  # a GET goes without a body


def test_a_bearer_token_works_and_a_post_body_goes_through(
    transactional_db, tenant, make_member, jupyter, agent
):
    headers = auth(make_member(tenant, Role.OWNER))
    answer = fetch(origin(jupyter.pk), "POST", "/api/x", headers, body=b"x" * 70000)
    assert answer.status_code == 200
    assert answer.text == "jupyter says POST " + "x" * 70000
    assert agent.seen[-1]["authorization"].startswith("Grant ")


def test_the_apps_cookies_stay_on_its_origin_and_may_not_name_the_origins(
    transactional_db, tenant, make_member, jupyter, agent
):
    answer = fetch(origin(jupyter.pk), "GET", "/cookies", auth(make_member(tenant)))
    assert answer.all("set-cookie") == [
        "theme=dark; Path=/",
        "sessionid=evil; path=/; HttpOnly",
    ]
    assert "connection" not in answer.headers


def test_a_grant_is_good_once_for_its_instance_and_port_and_for_a_minute(
    transactional_db, catalog, tenant, make_member, jupyter, agent, monkeypatch
):
    member = make_member(tenant, Role.MEMBER)
    grant = grant_for(member, jupyter.pk)
    assert fetch(grant["host"], "GET", grant["target"]).status_code == 302
    replayed = fetch(grant["host"], "GET", grant["target"])
    assert replayed.status_code == 403 and replayed.all("set-cookie") == []
    assert "This link has expired" in replayed.text
    assert f'href="http://localhost/instances/{jupyter.pk}/"' in replayed.text

    other = make_instance(catalog, tenant, state=State.RUNNING, name="other")
    for host in (origin(jupyter.pk, 9000), origin(other.pk)):
        grant = grant_for(member, jupyter.pk)
        answer = fetch(host, "GET", grant["target"])
        assert answer.status_code == 403 and answer.all("set-cookie") == []

    past = signing.b62_encode(int(time.time()) - port_origin.GRANT_SECONDS - 5)
    monkeypatch.setattr(signing.TimestampSigner, "timestamp", lambda self: past)
    grant = grant_for(member, jupyter.pk)
    expired = fetch(grant["host"], "GET", grant["target"])
    assert expired.status_code == 403 and expired.all("set-cookie") == []


def test_the_next_page_after_a_grant_is_on_the_port_origin_only(
    transactional_db, tenant, make_member, jupyter
):
    member = make_member(tenant, Role.MEMBER)
    for sneaky in ("//evil.example/", "https://evil.example/", "/\\evil.example"):
        grant = grant_for(member, jupyter.pk)
        target = grant["target"].split("&next=")[0] + "&next=" + quote(sneaky, safe="")
        assert fetch(grant["host"], "GET", target).headers["location"] == "/"


def test_anonymous_browsers_go_to_the_console_and_api_clients_get_401(
    transactional_db, jupyter, agent
):
    answer = fetch(origin(jupyter.pk), "GET", "/lab?x=1")
    assert answer.status_code == 302
    assert (
        answer.headers["location"] == f"http://localhost/instances/{jupyter.pk}/ports/8888/lab?x=1"
    )
    forged = fetch(origin(jupyter.pk), "GET", "/", [("cookie", "gpucloud-port=forged")])
    assert forged.status_code == 302
    api = fetch(origin(jupyter.pk), "POST", "/", [("accept", "application/json")])
    assert (api.status_code, api.json()["code"]) == (401, "not_authenticated")
    assert agent.seen == []


def test_the_old_console_path_signs_in_then_leads_to_the_port_origin(
    transactional_db, tenant, make_member, jupyter
):
    answer = Client().get(f"/instances/{jupyter.pk}/ports/8888/lab")
    assert answer.status_code == 302
    assert answer["Location"] == f"/login/?next=/instances/{jupyter.pk}/ports/8888/lab"
    member = signed_in(make_member(tenant, Role.MEMBER))
    answer = member.get(f"/instances/{jupyter.pk}/ports/8888?token=x")
    assert answer["Location"].startswith(f"http://{origin(jupyter.pk)}/.gpucloud/grant?g=")
    assert parse_qs(urlsplit(answer["Location"]).query)["next"] == ["/?token=x"]


@pytest.mark.parametrize(
    ("who", "host_port", "status", "code"),
    [
        ("stranger", 8888, 404, "not_found"),
        ("member", 8080, 404, "not_found"),
        ("viewer", 8888, 403, "permission_denied"),
    ],
)
def test_refusals_to_api_clients_and_browsers(
    transactional_db,
    tenant,
    other_tenant,
    make_member,
    jupyter,
    agent,
    who,
    host_port,
    status,
    code,
):
    membership = {
        "stranger": lambda: make_member(other_tenant, Role.OWNER),
        "member": lambda: make_member(tenant, Role.MEMBER),
        "viewer": lambda: make_member(tenant, Role.VIEWER),
    }[who]()
    host = origin(jupyter.pk, host_port)
    api = fetch(host, "GET", "/", auth(membership))
    assert (api.status_code, api.json()["code"]) == (status, code)
    page = signed_in(membership).get(f"/instances/{jupyter.pk}/ports/{host_port}/")
    assert page.status_code == status and b"Back to the instance" in page.content
    assert agent.seen == []


def test_access_is_checked_on_every_request_of_a_browser(
    transactional_db, tenant, make_member, jupyter, agent
):
    member = make_member(tenant, Role.MEMBER)
    cookie = session(member, jupyter.pk)
    assert fetch(origin(jupyter.pk), "GET", "/", [("cookie", cookie)]).status_code == 200
    member.role = Role.VIEWER
    member.save()
    page = fetch(origin(jupyter.pk), "GET", "/", [("cookie", cookie)])
    assert page.status_code == 403 and page.headers["content-type"].startswith("text/html")
    assert "Not allowed" in page.text and "<script" not in page.text
    assert f'href="http://testserver/instances/{jupyter.pk}/"' in page.text
    assert page.headers["x-frame-options"] == "DENY"
    member.delete()
    assert fetch(origin(jupyter.pk), "GET", "/", [("cookie", cookie)]).status_code == 404
    assert len(agent.seen) == 1


def test_a_cookie_is_for_its_own_origin_only(transactional_db, tenant, make_member, jupyter):
    cookie = session(make_member(tenant, Role.MEMBER), jupyter.pk)
    other_port = fetch(origin(jupyter.pk, 9000), "GET", "/", [("cookie", cookie)])
    assert other_port.status_code == 302  # no session there: to the console for a grant


def test_a_page_of_another_origin_may_not_post_with_the_cookie(
    transactional_db, tenant, make_member, jupyter, agent
):
    cookie = session(make_member(tenant, Role.MEMBER), jupyter.pk)
    sent = [("cookie", cookie), ("origin", f"http://{origin(jupyter.pk + 1)}")]
    answer = fetch(origin(jupyter.pk), "POST", "/api/x", sent, body=b"{}")
    assert answer.status_code == 403 and "Refused from another site" in answer.text
    sent = [("cookie", cookie), ("origin", f"http://{origin(jupyter.pk)}")]
    assert fetch(origin(jupyter.pk), "POST", "/api/x", sent, body=b"{}").status_code == 200


def test_a_stopped_instance_an_agent_away_and_nothing_listening(
    transactional_db, tenant, make_member, jupyter, agent
):
    member = make_member(tenant, Role.MEMBER)
    cookie = [("cookie", session(member, jupyter.pk))]
    page = fetch(
        origin(jupyter.pk, 9000), "GET", "/", [("cookie", session(member, jupyter.pk, 9000))]
    )
    assert page.status_code == 502 and "Nothing is listening on port 9000" in page.text
    api = fetch(origin(jupyter.pk, 9000), "GET", "/", auth(member))
    assert (api.status_code, api.json()["code"]) == (502, "port_unreachable")
    assert "error" not in api.json()

    jupyter.host.address = f"http://127.0.0.1:{free_port()}"
    jupyter.host.save()
    api = fetch(origin(jupyter.pk), "GET", "/", auth(member))
    assert (api.status_code, api.json()["code"]) == (502, "agent_unavailable")
    jupyter.state = State.STOPPED
    jupyter.save()
    api = fetch(origin(jupyter.pk), "GET", "/", auth(member))
    assert (api.status_code, api.json()["code"]) == (409, "not_running")
    page = fetch(origin(jupyter.pk), "GET", "/", cookie)
    assert page.status_code == 409 and "nb is stopped, not running." in page.text
    page = signed_in(member).get(f"/instances/{jupyter.pk}/ports/8888/")
    assert page.status_code == 409 and b"is stopped, not running" in page.content


@pytest.mark.parametrize(
    "target",
    ["/../../../../allocations", "/%2e%2e/%2e%2e/allocations", "/a/..%2f..%2fallocations",
     "/lab/%2E%2E/x", "/a%5c..%5cb"],
)  # fmt: skip
def test_dot_segments_and_encoded_separators_are_refused(
    transactional_db, tenant, make_member, jupyter, agent, target
):
    member = make_member(tenant, Role.MEMBER)
    api = fetch(origin(jupyter.pk), "GET", target, auth(member))
    assert (api.status_code, api.json()["code"]) == (400, "invalid_path")
    page = fetch(origin(jupyter.pk), "GET", target, [("cookie", session(member, jupyter.pk))])
    assert page.status_code == 400 and "Not a path this port serves" in page.text
    assert agent.seen == []


def test_the_api_gives_both_urls(transactional_db, tenant, make_member, jupyter, token_client):
    api = token_client(make_member(tenant, Role.MEMBER))
    (jupyter_port, app) = api.get(f"/api/v1/instances/{jupyter.pk}/").json()["ports"]
    assert jupyter_port == {
        "port": 8888,
        "name": "Jupyter",
        "url": f"http://testserver/instances/{jupyter.pk}/ports/8888/",
        "origin_url": f"http://{origin(jupyter.pk)}/",
    }
    assert app["origin_url"] == f"http://{origin(jupyter.pk, 9000)}/"


def test_a_jupyter_ports_links_sign_in_members_only(
    transactional_db, tenant, make_member, jupyter, token_client
):
    jupyter.image.ports = [{"port": 8888, "name": "Jupyter", "app": "jupyter"}]
    jupyter.image.save()
    member, viewer = make_member(tenant, Role.MEMBER), make_member(tenant, Role.VIEWER)
    query = f"?token={jupyter.app_token}"
    (lab, app) = token_client(member).get(f"/api/v1/instances/{jupyter.pk}/").json()["ports"]
    assert lab["url"] == f"http://testserver/instances/{jupyter.pk}/ports/8888/{query}"
    assert lab["origin_url"] == f"http://{origin(jupyter.pk)}/{query}"
    assert "?" not in app["url"] + app["origin_url"]  # a port without an app
    shown = token_client(viewer).get(f"/api/v1/instances/{jupyter.pk}/").json()["ports"]
    assert [p["url"] for p in shown] == [lab["url"].split("?")[0], app["url"]]
    assert jupyter.app_token not in json.dumps(shown)

    page = signed_in(member).get(f"/instances/{jupyter.pk}/").content.decode()
    assert f'href="/instances/{jupyter.pk}/ports/8888/{query}"' in page
    page = signed_in(viewer).get(f"/instances/{jupyter.pk}/").content.decode()
    assert jupyter.app_token not in page
    grant = grant_for(member, jupyter.pk, path=f"/{query}")  # the link, followed
    assert parse_qs(urlsplit(grant["target"]).query)["next"] == [f"/{query}"]


# --- websockets on the port origin ---------------------------------------------------------


@pytest.fixture
def sockets(catalog, tenant, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    port = free_port()
    host = catalog.host(gpus=1, mode=Mode.SHARED, address=f"http://127.0.0.1:{port}")
    catalog.image.ports = [{"port": 8888, "name": "Jupyter"}]
    catalog.image.save()
    instance = make_instance(catalog, tenant, state=State.RUNNING, name="ws")
    Allocation.objects.create(
        id=f"inst-{instance.pk}-a", instance=instance, host=host, mode="shared"
    )
    return instance, port, FakeAgent(f"secret-{host.name}")


def socket_to(host: str, target: str, headers) -> WebsocketCommunicator:
    from console.asgi import django_app

    raw_path, _, query = target.partition("?")
    client = WebsocketCommunicator(by_host(django_app), unquote(raw_path))
    client.scope["raw_path"] = raw_path.encode()
    client.scope["query_string"] = query.encode()
    client.scope["headers"] = [(b"host", host.encode()), *headers]
    return client


async def closed_with(client) -> int:
    connected, code = await client.connect(timeout=5)
    if not connected:
        return code
    message = await client.receive_output(timeout=3)
    assert message["type"] == "websocket.close"
    return message["code"]


def test_websockets_on_the_port_origin(transactional_db, tenant, make_member, sockets):
    instance, port, agent = sockets
    member = make_member(tenant, Role.MEMBER)
    cookie = (b"cookie", session(member, instance.pk).encode())
    same = (b"origin", f"http://{origin(instance.pk)}".encode())
    elsewhere = (b"origin", f"http://{origin(instance.pk + 1)}".encode())
    path = "/api/kernels/k1/channels?session_id=s1"
    token = bearer(member)
    viewer = bearer(make_member(tenant, Role.VIEWER))

    app_cookies = (b"cookie", b"_xsrf=x; username-a=b")

    async def scenario():
        async with serve(agent.handler, "127.0.0.1", port):
            browser = socket_to(origin(instance.pk), path, [cookie, app_cookies, same])
            assert (await browser.connect(timeout=5))[0]
            await browser.send_input({"type": "websocket.receive", "text": '{"msg": 1}'})
            assert (await browser.receive_output(timeout=3))["text"] == 'ok {"msg": 1}'
            await browser.send_input({"type": "websocket.disconnect", "code": 1000})
            await browser.wait(timeout=3)
            script = socket_to(origin(instance.pk), "/x", token)
            assert (await script.connect(timeout=5))[0]
            await script.send_input({"type": "websocket.disconnect", "code": 1000})
            await script.wait(timeout=3)
            refused = {
                "another origin's page": (origin(instance.pk), "/x", [cookie, elsewhere]),
                "no credentials": (origin(instance.pk), "/x", [same]),
                "an undeclared port": (origin(instance.pk, 9999), "/x", token),
                "a viewer": (origin(instance.pk), "/x", viewer),
                "dot-segments": (origin(instance.pk), "/a/%2e%2e/%2e%2e/terminal", token),
            }
            codes = {what: await closed_with(socket_to(*where)) for what, where in refused.items()}
            assert codes == {
                "another origin's page": 4404,
                "no credentials": 4404,
                "an undeclared port": 4404,
                "a viewer": 4403,
                "dot-segments": 4400,
            }

    run(scenario)
    assert agent.requests == [
        f"/v1/instances/{instance.pk}/ports/8888/api/kernels/k1/channels?session_id=s1",
        f"/v1/instances/{instance.pk}/ports/8888/x",
    ]
    forwarded = agent.headers[0]  # the app's cookies (never the origin's), its Origin and host
    assert forwarded.get_all("cookie") == ["_xsrf=x; username-a=b"]
    assert forwarded["origin"] == f"http://{origin(instance.pk)}"
    assert forwarded["x-forwarded-host"] == origin(instance.pk)
    assert forwarded["x-forwarded-proto"] == "http"
    assert "cookie" not in agent.headers[1]  # an API client's: no cookie at all


def test_the_console_serves_no_port_websocket(transactional_db, tenant, make_member, sockets):
    instance, port, agent = sockets
    headers = bearer(make_member(tenant, Role.MEMBER))

    async def scenario():
        async with serve(agent.handler, "127.0.0.1", port):
            client = socket_to("testserver", f"/instances/{instance.pk}/ports/8888/x", headers)
            assert (await client.connect(timeout=5))[0] is False

    run(scenario)
    assert agent.requests == []
