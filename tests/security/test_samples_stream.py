"""The agents' sample stream (/agent/v1/samples/stream) opens only to a host's secret given as a
bearer header: a browser's cookies, a tenant's token, a secret in the query string, another
scheme or a secret with something around it are refused before the socket is accepted; and on
a port's origin the path is the port's, never the console's stream."""

import asyncio

import pytest

from accounts.roles import Role
from accounts.services import issue_token
from console.asgi import application
from console.metrics.asgi import REFUSED_CLOSE_CODE, STREAM_PATH
from tests.factories import GpuModelFactory, RegionFactory
from tests.metrics.conftest import add_host

pytestmark = pytest.mark.django_db(transaction=True)


def open_stream(headers: list[tuple[bytes, bytes]], path: str = STREAM_PATH, query=b""):
    """The console's first answer to a websocket handshake on `path`."""
    sent = []

    async def receive():
        if sent:  # the app answered: the client goes away
            return {"type": "websocket.disconnect", "code": 1000}
        return {"type": "websocket.connect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "websocket",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "scheme": "ws",
        "subprotocols": [],
    }
    asyncio.run(application(scope, receive, send))
    return sent[0]


@pytest.fixture
def secret(db):
    add_host("host-a", RegionFactory(), GpuModelFactory())
    return "secret-of-host-a"


REFUSED = {"type": "websocket.close", "code": REFUSED_CLOSE_CODE}


def test_the_hosts_bearer_secret_opens_it(secret):
    assert open_stream([(b"authorization", f"Bearer {secret}".encode())]) == {
        "type": "websocket.accept"
    }


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        b"",
        b"Bearer ",
        b"Basic c2VjcmV0",
        b"Token secret-of-host-a",
        b"Bearer secret-of-host-a-but-longer",
        b"Bearer secret-of-host",
        b"Bearer SECRET-OF-HOST-A",
        b"Bearer secret-of-host-a\x00",
    ],
)
def test_anything_but_the_bearer_secret_is_refused_before_accepting(secret, authorization):
    headers = [(b"origin", b"http://localhost:8000"), (b"cookie", b"sessionid=abc")]
    if authorization is not None:
        headers.append((b"authorization", authorization))
    assert open_stream(headers) == REFUSED


def test_a_secret_in_the_query_string_is_not_a_secret(secret):
    assert open_stream([], query=f"secret={secret}&token={secret}".encode()) == REFUSED


def test_a_tenants_api_token_does_not_open_it(secret, tenant, make_member):
    member = make_member(tenant, Role.OWNER, username="alice")
    token = issue_token(member.user, tenant, "stream").raw
    assert open_stream([(b"authorization", f"Bearer {token}".encode())]) == REFUSED


def test_on_a_ports_origin_the_path_is_the_ports(secret, settings):
    """i7-8888.ports.localhost/agent/v1/samples/stream is instance 7's port 8888 (which does
    not exist here): never the console's stream, whatever the secret."""
    host = f"i7-8888.{settings.PORTS_DOMAIN}".encode()
    answer = open_stream([(b"host", host), (b"authorization", f"Bearer {secret}".encode())])
    assert answer != {"type": "websocket.accept"}
