"""Instances' web ports on origins of their own (i{id}-{port}.PORTS_DOMAIN), over a real ASGI
server: the demo image's web server in a container behind a real agent, reached by members
only and checked on every request; grants that work once, for one port; the app's cookies kept
to its origin; paths that try to leave the port; errors as pages and as JSON; websockets; and
the console's side (no port origin may post to it, nor be trusted by its settings)."""

import asyncio
import http.client
import json
import os
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
import redis
import websockets
from django.test import Client
from websockets.asyncio.server import serve

from accounts.models import Membership
from accounts.roles import Role
from agent.devtools.engine import DEMO_IMAGE
from console import processes
from console.catalog.models import Mode
from console.instances.models import Allocation, State
from tests.factories import ImageFactory
from tests.harness import running_stack
from tests.instances.conftest import Catalog
from tests.instances.e2e import api_client, make_catalog, make_tenant, start_agent, wait_for
from tests.instances.e2e import wait_state as wait_api_state
from tests.instances.helpers import make_instance
from tests.instances.test_terminal import FakeAgent

CONSOLE_HOST = "gpucloud.test"
PORTS_DOMAIN = "ports.gpucloud.test"
# The container's web server, with what a launch writes into it (env INDEX, SCRIPT) and a CGI
# script that tries to set the console's cookies.
SERVE = """mkdir -p /srv/cgi-bin
echo "$INDEX" > /srv/index.html
echo "$SCRIPT" > /srv/attack.js
echo "$COOKIE_CGI" > /srv/cgi-bin/cookie
busybox chmod 755 /srv/cgi-bin/cookie
exec httpd -f -v -p 8888 -h /srv"""
COOKIE_CGI = """#!/bin/sh
echo "Set-Cookie: sessionid=evil; Path=/"
echo "Set-Cookie: csrftoken=evil; Domain=gpucloud.test; Path=/"
echo "Content-Type: text/plain"
echo
echo cookies set"""


@pytest.fixture
def port_stack(transactional_db, redis_url, tmp_path, request, monkeypatch):
    """The stack with its console at gpucloud.test and its ports at *.ports.gpucloud.test
    (on its own port): a domain of which both are part, as in production."""
    redis.Redis.from_url(redis_url).flushdb()
    monkeypatch.setenv("PORTS_DOMAIN", PORTS_DOMAIN)
    monkeypatch.setenv("ALLOWED_HOSTS", f"{CONSOLE_HOST},127.0.0.1")
    monkeypatch.setenv("AGENT_TIMEOUT_SECONDS", "3")
    with running_stack(redis_url, tmp_path, request.node) as stack:
        stack.console = f"http://{CONSOLE_HOST}:{stack.port}"
        yield stack


def port_host(stack, instance_id: int, port: int = 8888) -> str:
    return f"i{instance_id}-{port}.{PORTS_DOMAIN}:{stack.port}"


def call(stack, host: str, target: str, method="GET", headers=None, body=None):
    """One request to the server at `host`, its target sent as it is (never normalized)."""
    connection = http.client.HTTPConnection("127.0.0.1", stack.port, timeout=20)
    try:
        connection.request(method, target, body=body, headers={"Host": host, **(headers or {})})
        answer = connection.getresponse()
        return answer.status, answer.getheaders(), answer.read().decode(errors="replace")
    finally:
        connection.close()


def headers_named(headers, name: str) -> list[str]:
    return [value for key, value in headers if key.lower() == name]


def launch_site(stack, api, script: str = "", ports=()) -> dict:
    """A running instance of the demo image serving a page (with `script` as /attack.js) and
    /cgi-bin/cookie; answers it as the API shows it, once its page answers."""
    index = '<!doctype html><h1>site</h1><pre id="result"></pre><script src="/attack.js"></script>'
    body = {
        "name": "site",
        "spec": "a100-quarter",
        "image": "demo-busybox",
        "command": ["sh", "-c", SERVE],
        "env": {"INDEX": index, "SCRIPT": script, "COOKIE_CGI": COOKIE_CGI},
        "ports": list(ports),
    }
    created = api.post("/instances/", json=body)
    assert created.status_code == 202, created.text
    instance = wait_api_state(api, created.json()["id"], "running", stack)
    token = {"Authorization": api.headers["Authorization"]}
    host = port_host(stack, instance["id"])
    wait_for(lambda: call(stack, host, "/", headers=token)[0] == 200, what="the site", stack=stack)
    return instance


def with_demo_image(stack, container_engine) -> None:
    make_catalog()
    ImageFactory(
        name="demo-busybox", reference=DEMO_IMAGE, command=[], cuda_version="-",
        ports=[{"port": 8888, "name": "Jupyter"}],
    )  # fmt: skip
    start_agent(stack, "gpu-1", gpus=2, runtime="oci", engine_url=container_engine.url)


def session_cookie(membership) -> str:
    browser = Client()
    browser.force_login(membership.user)
    return f"sessionid={browser.cookies['sessionid'].value}"


@pytest.mark.integration
@pytest.mark.containers
def test_a_containers_port_on_its_own_origin(port_stack, container_engine):
    stack = port_stack
    with_demo_image(stack, container_engine)
    tenant, mia = make_tenant()
    api = api_client(stack, mia)
    site = launch_site(stack, api, ports=[{"port": 9000, "name": "nothing"}])
    pk = site["id"]
    origin = port_host(stack, pk)
    token = {"Authorization": api.headers["Authorization"], "Accept": "application/json"}
    assert site["ports"][0] == {
        "port": 8888,
        "name": "Jupyter",
        "url": f"{stack.url}/instances/{pk}/ports/8888/",
        "origin_url": f"http://{origin}/",
    }
    status, _, page = call(stack, origin, "/", headers=token)
    assert status == 200 and "<h1>site</h1>" in page

    # a browser: the console's link hands it a grant, which the port origin makes its cookie
    console = f"{CONSOLE_HOST}:{stack.port}"
    browser = {"Cookie": session_cookie(mia)}
    status, headers, _ = call(stack, console, f"/instances/{pk}/ports/8888/", headers=browser)
    grant = urlsplit(headers_named(headers, "location")[0])
    assert status == 302 and grant.netloc == origin
    grant_target = f"{grant.path}?{grant.query}"
    status, headers, _ = call(stack, origin, grant_target)
    (cookie,) = headers_named(headers, "set-cookie")
    assert status == 302 and "HttpOnly" in cookie and "Domain" not in cookie
    own = {"Cookie": cookie.split(";")[0]}
    assert call(stack, origin, "/", headers=own)[0] == 200
    status, headers, page = call(stack, origin, grant_target)
    assert (
        status == 403
        and "This link has expired" in page
        and not headers_named(headers, "set-cookie")
    )
    status, headers, _ = call(stack, console, f"/instances/{pk}/ports/8888/", headers=browser)
    other_port = urlsplit(headers_named(headers, "location")[0])
    status, _, _ = call(stack, port_host(stack, pk, 9000), f"{other_port.path}?{other_port.query}")
    assert status == 403

    # the app's cookies stay on its origin
    _, headers, _ = call(stack, origin, "/cgi-bin/cookie", headers=own)
    set_cookies = headers_named(headers, "set-cookie")
    assert "sessionid=evil" in " ".join(set_cookies) and "csrftoken=evil" in " ".join(set_cookies)
    assert not any("domain" in cookie.lower() for cookie in set_cookies)

    # everyone else: anonymous, another tenant, a viewer, an undeclared port
    status, headers, _ = call(stack, origin, "/tree?x=1")
    assert status == 302
    assert headers_named(headers, "location") == [
        f"http://{console}/instances/{pk}/ports/8888/tree?x=1"
    ]
    _, outsider = make_tenant(slug="globex", username="olga")
    viewer = Membership.objects.create(user=outsider.user, tenant=tenant, role=Role.VIEWER)
    for who, host, expected in [
        (api_client(stack, outsider), origin, (404, "not_found")),
        (api_client(stack, viewer), origin, (403, "permission_denied")),
        (api, port_host(stack, pk, 9999), (404, "not_found")),
    ]:
        status, _, body = call(
            stack, host, "/", headers={"Authorization": who.headers["Authorization"]}
        )
        assert (status, json.loads(body)["code"]) == expected

    # paths that try to leave the port for the agent's control routes
    for target in ["/../../../../allocations", "/%2e%2e/%2e%2e/%2e%2e/allocations",
                   "/..%2f..%2f..%2fallocations", "/x/..%2F..%2Finventory"]:  # fmt: skip
        status, _, body = call(stack, origin, target, headers=token)
        assert status == 400 and '"invalid_path"' in body, (target, body)
        status, _, body = call(stack, origin, target, headers=own)
        assert status == 400 and "Not a path this port serves" in body
    assert call(stack, origin, "/", headers=token)[0] == 200  # the allocation is still there

    # a declared port where nothing listens, then a stopped instance
    nothing = port_host(stack, pk, 9000)
    status, _, body = call(stack, nothing, "/", headers=token)
    assert status == 502 and '"code": "port_unreachable"' in body
    status, _, body = call(stack, nothing, "/", headers={"Authorization": token["Authorization"]})
    assert '"error"' not in body
    assert api.post(f"/instances/{pk}/stop/").status_code == 202
    wait_api_state(api, pk, "stopped", stack)
    status, _, body = call(stack, origin, "/", headers=token)
    assert status == 409 and '"code": "not_running"' in body
    status, headers, page = call(stack, origin, "/", headers=own)
    assert status == 409 and "is stopped, not running" in page
    assert f'href="http://{console}/instances/{pk}/"' in page  # where the grant came from
    assert headers_named(headers, "x-frame-options") == ["DENY"]


@pytest.mark.integration
def test_a_websocket_through_the_port_origin(port_stack):
    stack = port_stack
    catalog = Catalog()
    tenant, mia = make_tenant()
    agent_port = processes.free_port()
    host = catalog.host(gpus=1, mode=Mode.SHARED, address=f"http://127.0.0.1:{agent_port}")
    catalog.image.ports = [{"port": 8888, "name": "Jupyter"}]
    catalog.image.save()
    instance = make_instance(catalog, tenant, state=State.RUNNING, name="ws")
    Allocation.objects.create(
        id=f"inst-{instance.pk}-a", instance=instance, host=host, mode="shared"
    )
    agent = FakeAgent(f"secret-{host.name}")
    token = api_client(stack, mia).headers["Authorization"]
    origin = port_host(stack, instance.pk)
    url = f"ws://{origin}/api/kernels/k1/channels?session_id=s1"
    console_route = f"ws://{CONSOLE_HOST}:{stack.port}/instances/{instance.pk}/ports/8888/x"
    server = {"host": "127.0.0.1", "port": stack.port}  # the URL's name is for the Host header

    async def scenario():
        async with serve(agent.handler, "127.0.0.1", agent_port):
            bearer = {"Authorization": token}
            async with websockets.connect(url, additional_headers=bearer, **server) as ws:
                await ws.send('{"msg": 1}')
                assert await asyncio.wait_for(ws.recv(), 5) == 'ok {"msg": 1}'
            anonymous = {"Origin": f"http://{origin}"}
            async with websockets.connect(url, additional_headers=anonymous, **server) as ws:
                await ws.wait_closed()
                assert ws.close_code == 4404
            # the console's origin routes no port: closed at once (4404, an unrouted path)
            async with websockets.connect(console_route, additional_headers=bearer, **server) as ws:
                await ws.wait_closed()
                assert ws.close_code == 4404

    asyncio.run(scenario())
    assert agent.requests == [
        f"/v1/instances/{instance.pk}/ports/8888/api/kernels/k1/channels?session_id=s1"
    ]


@pytest.mark.django_db
def test_the_console_refuses_a_post_from_a_port_origin_even_with_a_tossed_csrf_cookie(
    tenant, make_member
):
    """A page on a port origin can set `csrftoken` for the whole domain; the console still
    checks where the POST comes from (Origin), and no port origin is trusted."""
    member = make_member(tenant, Role.OWNER)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(member.user)
    tossed = "t" * 32
    browser.cookies["csrftoken"] = tossed
    form = {"csrfmiddlewaretoken": tossed, "name": "stolen"}
    answer = browser.post("/tokens/", form, HTTP_ORIGIN="http://i6-8888.ports.localhost")
    assert answer.status_code == 403
    assert not member.user.api_tokens.exists()
    assert browser.post("/tokens/", form, HTTP_ORIGIN="http://testserver").status_code == 302


@pytest.mark.integration
@pytest.mark.parametrize(
    "env",
    [
        {"ALLOWED_HOSTS": ".example.com", "PORTS_DOMAIN": "ports.example.com"},
        {"ALLOWED_HOSTS": "*", "PORTS_DOMAIN": "ports.example.com"},
        {"CSRF_TRUSTED_ORIGINS": "https://*.example.com", "PORTS_DOMAIN": "ports.example.com"},
    ],
)
def test_settings_that_would_trust_the_ports_origins_are_refused(env):
    check = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings", **env},
        capture_output=True,
        text=True,
    )
    assert check.returncode != 0 and "covers the ports' hosts" in check.stderr


@pytest.mark.integration
def test_https_gives_the_consoles_cookies_the_host_prefix():
    check = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import "
         "settings as s; print(s.SESSION_COOKIE_NAME, s.CSRF_COOKIE_NAME)"],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings", "HTTPS": "true"},
        capture_output=True, text=True,
    )  # fmt: skip
    assert check.stdout.split() == ["__Host-sessionid", "__Host-csrftoken"], check.stderr
