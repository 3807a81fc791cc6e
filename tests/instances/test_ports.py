"""/instances/{id}/ports/{port}/…: the console's proxy of an instance's web ports, against
a stand-in agent (uvicorn on loopback): what reaches the agent (the host secret, never the
console's cookies or token), what comes back, and every refusal."""

import socket
import threading
import time

import httpx
import pytest
import uvicorn
from django.test import Client

from accounts.roles import Role
from console.catalog.models import Mode
from console.instances.models import Allocation, State
from console.instances.ports import with_ports_route
from tests.instances.helpers import make_instance
from tests.instances.test_websocket import bearer, run

pytestmark = pytest.mark.usefixtures("no_tasks")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandInAgent:
    """Answers /v1/instances/{pk}/ports/{port}/… with what it received; 502 for port 9000."""

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
        self.seen.append({"path": scope["path"], "query": scope["query_string"], **headers})
        if "/ports/9000/" in scope["path"]:
            status, answer = 502, b'{"error": "port_unreachable"}'
        else:
            status, answer = 200, b"jupyter says " + scope["method"].encode() + b" " + body
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"x-app", b"jupyter")],
            }
        )
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


def fetch(method, path, headers, **kwargs) -> httpx.Response:
    from console.asgi import django_app

    app = with_ports_route(django_app)
    answers = []

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            answers.append(await client.request(method, path, headers=headers, **kwargs))

    run(scenario)
    return answers[0]


def auth(membership) -> dict:
    return {k.decode(): v.decode() for k, v in bearer(membership)}


def test_a_member_reaches_the_port_without_the_consoles_credentials(
    transactional_db, tenant, make_member, jupyter, agent
):
    headers = {**auth(make_member(tenant, Role.MEMBER)), "cookie": "sessionid=s3cret; x=1"}
    answer = fetch("GET", f"/instances/{jupyter.pk}/ports/8888/lab/tree?a=1", headers)
    assert answer.status_code == 200
    assert answer.text == "jupyter says GET "
    assert answer.headers["x-app"] == "jupyter"
    seen = agent.seen[-1]
    assert seen["path"] == f"/v1/instances/{jupyter.pk}/ports/8888/lab/tree"
    assert seen["query"] == b"a=1"
    assert seen["authorization"] == f"Bearer secret-{jupyter.host.name}"
    assert "cookie" not in seen
    assert "transfer-encoding" not in seen  # a GET goes without a body


def test_a_post_body_goes_through(transactional_db, tenant, make_member, jupyter, agent):
    headers = auth(make_member(tenant, Role.OWNER))
    answer = fetch(
        "POST", f"/instances/{jupyter.pk}/ports/8888/api/x", headers, content=b"x" * 70000
    )
    assert answer.status_code == 200
    assert answer.text == "jupyter says POST " + "x" * 70000


def test_a_session_works_too(transactional_db, tenant, make_member, jupyter, agent):
    member = make_member(tenant, Role.MEMBER)
    browser = Client()
    browser.force_login(member.user)
    cookie = f"sessionid={browser.cookies['sessionid'].value}"
    answer = fetch("GET", f"/instances/{jupyter.pk}/ports/9000/", {"cookie": cookie})
    assert answer.status_code == 502  # what the agent said: nothing listens there
    assert answer.json() == {"error": "port_unreachable"}
    assert "cookie" not in agent.seen[-1]


@pytest.mark.parametrize(
    ("who", "path", "status", "error"),
    [
        ("stranger", "8888/", 404, "not_found"),
        ("member", "8080/", 404, "not_found"),
        ("member", "70000/", 404, "not_found"),
        ("viewer", "8888/", 403, "permission_denied"),
    ],
)
def test_refusals(
    transactional_db, tenant, other_tenant, make_member, jupyter, agent, who, path, status, error
):
    membership = {
        "stranger": lambda: make_member(other_tenant, Role.OWNER),
        "member": lambda: make_member(tenant, Role.MEMBER),
        "viewer": lambda: make_member(tenant, Role.VIEWER),
    }[who]()
    answer = fetch("GET", f"/instances/{jupyter.pk}/ports/{path}", auth(membership))
    assert (answer.status_code, answer.json()["error"]) == (status, error)
    assert agent.seen == []


def test_a_stopped_instance_and_an_agent_away(
    transactional_db, tenant, make_member, jupyter, agent
):
    headers = auth(make_member(tenant, Role.MEMBER))
    jupyter.host.address = f"http://127.0.0.1:{free_port()}"
    jupyter.host.save()
    answer = fetch("GET", f"/instances/{jupyter.pk}/ports/8888/", headers)
    assert (answer.status_code, answer.json()["error"]) == (502, "agent_unavailable")
    jupyter.state = State.STOPPED
    jupyter.save()
    answer = fetch("GET", f"/instances/{jupyter.pk}/ports/8888/", headers)
    assert (answer.status_code, answer.json()["error"]) == (409, "not_running")


def test_redirects(transactional_db, jupyter):
    answer = fetch("GET", f"/instances/{jupyter.pk}/ports/8888?token=x", {})
    assert answer.status_code == 302
    assert answer.headers["location"] == f"/instances/{jupyter.pk}/ports/8888/?token=x"
    answer = fetch("GET", f"/instances/{jupyter.pk}/ports/8888/lab", {})
    assert answer.status_code == 302
    assert answer.headers["location"] == f"/login/?next=/instances/{jupyter.pk}/ports/8888/lab"
