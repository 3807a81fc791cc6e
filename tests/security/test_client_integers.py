"""Integers from clients (issue 41, "Smaller holes"): '²' is a digit to str.isdigit() and no
number to int(), int() reads '٣', '１' and '3\\n', and a long enough number overflows a column.
Every integer a client sends, wherever the OpenAPI document, the console's forms and pages, or
the websocket routes take one, is read the one way console/integers.py reads it: these values
are a field's 400 (a page's message, a socket's close code) in words, never a server error,
never Python's exception text, never quietly taken for another number."""

import ast
import asyncio
import json
import re
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import websockets
from django import forms
from django.core.exceptions import ValidationError
from django.urls import URLResolver, get_resolver
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.server import serve

from accounts import forms as account_forms
from accounts import services as accounts
from accounts.roles import Role
from agent import grants
from agent.api import create_app
from agent.backends.sim import SimBackend
from agent.gpu_models import MODELS
from agent.host import LocalHost
from agent.identity import HostSecret
from agent.runtimes.sim import SimRuntime
from agent.state import StateStore
from billing import forms as billing_forms
from console import integers
from console.asgi import application
from console.catalog import admin_forms
from console.fleet import admin as fleet_admin
from console.fleet import forms as fleet_forms
from console.idle import forms as idle_forms
from console.instances import forms as instance_forms
from console.instances.models import Allocation, State
from console.launch_templates import services as templates
from console.notices import KINDS
from console.notifications import forms as notification_forms
from console.notifications import services as notifications
from console.routing import websocket_urlpatterns
from console.snapshots.models import Schedule, Snapshot
from console.volumes.models import Volume
from tests.clients import signed_in
from tests.instances.helpers import make_instance
from tests.instances.test_terminal import APP, FakeAgent, free_port
from tests.instances.test_websocket import bearer
from tests.metrics.communicator import WebsocketCommunicator, run

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("console", "accounts", "billing", "agent", "cli")

# What clients send where a whole number belongs: digits of other scripts and superscripts,
# fullwidth digits, a trailing newline, a space, a NUL, and numbers too large for any column
# (the last one past Python's own 4300-digit limit for int()).
UNICODE = ["²", "٣", "１", "1²"]
BAD = [*UNICODE, "1\n", " 1", "1\x00", "9" * 30, "9" * 5000]
# Python's words, which a client must never read.
EXCEPTION_TEXT = re.compile(
    r"invalid literal|Traceback|ValueError|OverflowError|int\(\)|base 10|Exceeds the limit|"
    r"expected a number|too large to convert"
)


def words_only(text: str) -> None:
    assert not EXCEPTION_TEXT.search(text), text[:500]


@pytest.fixture
def owner(tenant, make_member):
    return make_member(tenant, Role.OWNER, username="olga")


@pytest.fixture
def things(catalog, tenant):
    """One of each thing a path names, so that a body's fields are read."""
    host = catalog.host(gpus=1)
    instance = make_instance(catalog, tenant, state=State.STOPPED, name="keeper", disk_host=host)
    volume = Volume.objects.create(
        tenant=tenant, name="data", size_gib=5, region=catalog.region, host=host
    )
    snapshot = Snapshot.objects.create(
        tenant=tenant, region=catalog.region, instance=instance, source_name="keeper",
        disk_name=instance.disk_name, size_gib=10, host=host, state=Snapshot.State.DONE,
        finished_at=timezone.now(), restic_id="ab" * 32,
    )  # fmt: skip
    template = templates.create_template(
        tenant, name="tpl", spec=catalog.quarter, image=catalog.image, region=catalog.region
    )
    endpoint, _ = notifications.create_endpoint(
        tenant, name="ops", channel="email", target="ops@example.com", kinds=list(KINDS)[:1]
    )
    return {
        "notifications": endpoint.pk,
        "instances": instance.pk,
        "volumes": volume.pk,
        "snapshots": snapshot.pk,
        "templates": template.pk,
    }


def _document() -> dict:
    return json.loads(OpenApiJsonRenderer().render(SchemaGenerator().get_schema(public=True)))


DOCUMENT = _document()


def _resolve(schema: dict) -> dict:
    while "$ref" in schema:
        schema = DOCUMENT["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _integer_fields(schema: dict) -> list[tuple[str, str | None]]:
    """(top-level field, nested field or None) of every writable integer in a request body."""
    found = []
    for name, field in _resolve(schema).get("properties", {}).items():
        field = _resolve(field)
        if field.get("readOnly"):
            continue
        if field.get("type") == "integer":
            found.append((name, None))
        elif field.get("type") == "array" and "properties" in _resolve(field.get("items", {})):
            for inner, _ in _integer_fields(field["items"]):
                found.append((name, inner))
    return found


def _operations():
    for path, operations in DOCUMENT["paths"].items():
        for method, operation in operations.items():
            if method in {"get", "post", "put", "patch", "delete"}:
                yield path, method, operation


def _filled(path: str, things: dict) -> str:
    resource = path.split("/")[3]
    return re.sub(r"\{[^}]+\}", str(things.get(resource, 1)), path)


QUERY = [
    (path, method, parameter["name"])
    for path, method, operation in _operations()
    for parameter in operation.get("parameters", [])
    if parameter["in"] == "query" and parameter["schema"].get("type") == "integer"
]
PATHS = sorted(
    {(path, method) for path, method, _ in _operations() if "{" in path and method == "get"}
)
BODIES = [
    (path, method, field, inner, "multipart/form-data" in content)
    for path, method, operation in _operations()
    for content in [operation.get("requestBody", {}).get("content", {})]
    for field, inner in _integer_fields(content.get("application/json", {}).get("schema", {}))
]


def test_the_document_declares_what_these_tests_walk():
    """A walk over nothing proves nothing: the document names the integers the issue found."""
    assert {("/api/v1/instances/{id}/logs/", "tail"), ("/api/v1/volumes/price/", "size_gib")} <= {
        (path, name) for path, _, name in QUERY
    }
    assert {("/api/v1/volumes/", "size_gib"), ("/api/v1/snapshots/", "instance")} <= {
        (path, field) for path, method, field, _, _ in BODIES if method == "post"
    }
    assert len(PATHS) > 10


@pytest.mark.parametrize(("path", "method", "name"), QUERY)
def test_a_query_parameter_is_a_whole_number_or_a_400(
    token_client, owner, things, path, method, name
):
    client = token_client(owner)
    for value in BAD:
        answer = getattr(client, method)(_filled(path, things), {name: value})
        assert answer.status_code == 400, (value, answer.status_code, answer.content[:300])
        assert name in answer.json()["errors"], answer.json()
        words_only(answer.content.decode())


@pytest.mark.parametrize(("path", "method"), PATHS)
def test_a_path_id_that_is_no_whole_number_names_nothing(token_client, owner, things, path, method):
    client = token_client(owner)
    for value in [*UNICODE, "9" * 30, "9" * 5000]:
        answer = client.get(re.sub(r"\{[^}]+\}", value, path, count=1).replace("//", "/"))
        assert answer.status_code in (400, 404), (value, answer.status_code, answer.content[:300])
        words_only(answer.content.decode())


def test_a_unicode_id_is_not_another_id(token_client, owner, things):
    """int('١') is 1: the instance with id 1 (or 3, or 5) must not answer to it."""
    client = token_client(owner)
    pk = things["instances"]
    for spelled in ("٠١٢٣٤٥٦٧٨٩", "０１２３４５６７８９"):
        other = "".join(spelled[int(digit)] for digit in str(pk))
        assert client.get(f"/api/v1/instances/{other}/").status_code == 404


@pytest.mark.parametrize(("path", "method", "field", "inner", "takes_forms"), BODIES)
def test_a_body_integer_is_a_whole_number_or_a_400(
    token_client, owner, things, path, method, field, inner, takes_forms
):
    client = token_client(owner)
    url = _filled(path, things)
    for value in [*BAD, 10**30, -(10**30), 1.5, True]:
        body = {field: [{inner: value, "name": "web"}]} if inner else {field: value}
        answer = getattr(client, method)(url, body, format="json")
        assert answer.status_code == 400, (value, answer.status_code, answer.content[:300])
        assert field in answer.json()["errors"], (value, answer.json())
        words_only(answer.content.decode())
        if takes_forms and inner is None and isinstance(value, str):  # a form's body too
            answer = getattr(client, method)(url, {field: value}, format="multipart")
            assert answer.status_code == 400 and field in answer.json()["errors"], value


def test_a_month_of_other_digits_is_a_400_in_words(token_client, owner):
    client = token_client(owner)
    months = ["²²²²-²²", "٢٠٢٦-٠٥", "２０２６-０５", "2026-05\n", "2026-5\x00", "2026-1²"]
    for path in [p for p, m, op in _operations() if "month" in str(op.get("parameters", ""))]:
        for month in months:
            answer = client.get(path, {"month": month})
            assert answer.status_code == 400, (path, month, answer.status_code)
            assert "month" in answer.json()["errors"], answer.json()
            words_only(answer.content.decode())


# The console's forms: every field of theirs that takes a whole number.
FORM_MODULES = [
    account_forms, billing_forms, admin_forms, fleet_admin, fleet_forms, idle_forms,
    instance_forms, notification_forms,
]  # fmt: skip
NUMBER_FIELDS = [
    pytest.param(form, name, id=f"{form.__name__}.{name}")
    for module in FORM_MODULES
    for form in vars(module).values()
    if isinstance(form, type) and issubclass(form, forms.BaseForm)
    and form.__module__ == module.__name__
    for name, field in form.base_fields.items()
    if isinstance(field, forms.IntegerField)
    and not isinstance(field, forms.FloatField | forms.DecimalField)
]  # fmt: skip


def test_the_forms_have_number_fields_to_walk():
    assert len(NUMBER_FIELDS) >= 6


@pytest.mark.django_db
@pytest.mark.parametrize(("form", "name"), NUMBER_FIELDS)
def test_a_form_number_field_refuses_what_is_no_whole_number(form, name):
    field = form.base_fields[name]
    for value in BAD:
        with pytest.raises(ValidationError) as refused:
            field.clean(value)
        words_only(" ".join(refused.value.messages))


# The console's pages that read a number from a POST themselves.
@pytest.mark.parametrize("value", BAD)
def test_the_pages_numbers_are_refused_in_words(catalog, tenant, owner, things, no_tasks, value):
    web = signed_in(owner)
    volumes = Volume.objects.count()
    steps = [
        ("/volumes/create/", {"region": catalog.region.code, "name": "big", "size_gib": value}),
        (f"/volumes/{things['volumes']}/attach/", {"instance": value}),
        ("/snapshots/take/", {"source": f"instance:{value}"}),
        (
            "/snapshots/schedules/",
            {"source": f"instance:{things['instances']}", "every_hours": value, "keep": "3"},
        ),
        (f"/snapshots/{things['snapshots']}/restore/", {"name": "back", "size_gib": value}),
        ("/billing/budget-notice/dismiss/", {"level": value}),
    ]
    for url, form in steps:
        answer = web.post(url, form, follow=True)
        assert answer.status_code in (200, 404), (url, answer.status_code)
        words_only(answer.content.decode())
    assert Volume.objects.count() == volumes  # neither '٣' GiB nor a restore of '٣' GiB
    assert not Schedule.objects.exists()


def _url_paths(value: str) -> list[str]:
    """Every HTTP path of the URLconf with a number in it (the admin's aside), the number
    spelled `value`."""

    def walk(patterns, prefix=""):
        for pattern in patterns:
            text = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                if not text.startswith("admin/"):
                    yield from walk(pattern.url_patterns, text)
            elif ("<int:" in text or "[0-9]+" in text) and "(?P<format>" not in text:
                yield text

    paths = set()
    for text in walk(get_resolver().url_patterns):
        text = re.sub(r"<int:\w+>|\(\?P<\w+>\[0-9\]\+\)", value, text)
        text = text.replace("(?P<port>[0-9]{1,5})", "80").replace("(?:/.*)?", "")
        text = re.sub(r"\(\?P<\w+>([a-z]+)\|[^)]*\)", r"\1", text)  # stop|start|…: stop
        paths.add("/" + re.sub(r"\^|\$|\\Z", "", text))
    return sorted(paths)


def test_every_path_with_a_number_takes_a_huge_one_without_a_server_error(owner, things, no_tasks):
    owner.user.is_staff = True  # the operator's pages too
    owner.user.save()
    web = signed_in(owner)
    paths = _url_paths("9" * 30)
    assert len(paths) > 30
    for path in paths:
        for method in (web.get, web.post):
            answer = method(path)
            assert answer.status_code < 500, (method.__name__, path, answer.status_code)
            words_only(answer.content.decode(errors="replace"))


# Websockets: every route's parameters, the terminal's size, and paths no route takes.
def _socket_paths(value: str) -> list[str]:
    return [
        "/" + re.sub(r"<int:[a-z_]+>", value, str(route.pattern))
        for route in websocket_urlpatterns
        if "<int:" in str(route.pattern)
    ]


def _closes(path: str, headers, query: bytes = b"") -> int:
    """The code a socket to `path` is closed with (accepted first or not); a consumer that
    raised fails here, as the server would answer 500."""

    async def scenario():
        client = WebsocketCommunicator(
            application, path, headers=[(b"host", b"testserver"), *headers]
        )
        client.scope["query_string"] = query
        accepted, code = await client.connect(timeout=3)
        if accepted:
            code = (await client.receive_output(timeout=3))["code"]
        await client.disconnect()
        return code

    return run(scenario)


def test_every_socket_route_with_a_number_is_walked():
    assert len(_socket_paths("1")) >= 3


@pytest.mark.django_db(transaction=True)
def test_a_socket_path_with_a_huge_or_foreign_number_closes_cleanly(tenant, owner, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    headers = bearer(owner)
    for value in ["9" * 30, "9" * 5000, "²", "%C2%B2", "١"]:
        for path in _socket_paths(value):
            assert 4000 <= _closes(path, headers) < 5000, path[:80]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["/ws/nothing/", "/ws/instances/x/terminal/", "/", "/api/v1/"])
def test_a_socket_no_route_takes_closes_4404(tenant, owner, path):
    assert _closes(path, bearer(owner)) == 4404


@pytest.mark.django_db(transaction=True)
def test_the_terminal_refuses_a_size_that_is_no_number(catalog, tenant, owner, no_tasks):
    port = free_port()
    host = catalog.host(gpus=1, address=f"http://127.0.0.1:{port}")
    instance = make_instance(catalog, tenant, state=State.RUNNING, name="shell")
    Allocation.objects.create(
        id=f"inst-{instance.pk}-a", instance=instance, host=host, mode="shared"
    )
    agent = FakeAgent(f"secret-{host.name}")
    headers = bearer(owner)

    async def scenario():
        codes = []
        async with serve(agent.handler, "127.0.0.1", port):
            for value in ["%C2%B2", "%D9%A3", "%EF%BC%91", "80%0A", "80%00", "9" * 30, "0", "1001"]:
                for name in ("cols", "rows"):
                    client = WebsocketCommunicator(
                        APP, f"/ws/instances/{instance.pk}/terminal/", headers=headers
                    )
                    client.scope["query_string"] = f"{name}={value}".encode()
                    accepted, code = await client.connect(timeout=3)
                    closing = (await client.receive_output(timeout=3)) if accepted else {}
                    codes.append((value, name, closing.get("code", code), closing.get("reason")))
                    await client.disconnect()
        return codes

    for value, name, code, reason in run(scenario):
        assert code == 4400, (value, name, code)
        assert reason == "cols and rows: A whole number from 1 to 1000.", reason
    assert agent.requests == []  # no shell was opened with a size read some other way


# The agent reads the numbers of its own clients (the console, a browser's terminal through it)
# with its copy of the parser (agent/integers.py).
AGENT_SECRET = "s3cret-of-the-host"  # noqa: S105 - a test host's


@pytest.fixture
def agent_app(tmp_path):
    backend = SimBackend("h", MODELS["l4"], ["whole"])
    return create_app(
        LocalHost("h", backend, SimRuntime(), StateStore(tmp_path)), HostSecret(AGENT_SECRET)
    )


def test_the_agent_answers_a_tail_that_is_no_number_with_a_400(agent_app):
    async def ask(tail: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=agent_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
            return await client.get(
                f"/v1/instances/7/logs?tail={quote(tail)}",
                headers={"Authorization": f"Bearer {AGENT_SECRET}"},
            )

    for value in BAD:
        answer = asyncio.run(ask(value))
        assert answer.status_code == 400, (value, answer.status_code, answer.text[:200])
        assert answer.json()["detail"].startswith("tail: A whole number from 1 to ")
        words_only(answer.text)


def test_the_agent_refuses_a_terminal_size_that_is_no_number(agent_app):
    expires = int(time.time()) + 60
    key = grants.data_key(AGENT_SECRET)
    grant = f"{expires}.{grants.signature(key, ('terminal', '7'), expires)}"
    client = TestClient(agent_app)
    for value in ["%D9%A8%D9%A0", "%EF%BC%98%EF%BC%90", "80%0A", "80%00", "+80", "9" * 30]:
        path = f"/v1/instances/7/terminal?cols={value}"
        headers = {"Authorization": f"Grant {grant}"}
        with (
            client.websocket_connect(path, headers=headers) as ws,
            pytest.raises(WebSocketDisconnect) as closed,
        ):
            ws.receive_bytes()
        assert closed.value.code == 4400, value  # not a shell of 80 columns read another way


def test_the_parser_reads_ascii_digits_only():
    assert integers.parse("0") == 0 and integers.parse("42", minimum=1, maximum=42) == 42
    assert integers.parse("-3", minimum=-5) == -3
    for text in [*BAD, "", "-1", "+1", "1_000", "0x10", "1e3", "1.0", None, 3]:
        with pytest.raises(integers.NotAWholeNumber, match="^A whole number from 0 to "):
            integers.parse(text)
    with pytest.raises(integers.NotAWholeNumber):
        integers.parse("43", maximum=42)


def _calls_named(names: set[str]) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and node.attr in names:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    return found


def test_no_code_asks_str_whether_it_is_a_number():
    """str.isdigit() (and isdecimal, isnumeric) say yes to what int() refuses or reads as
    another number: a client's text becomes a number through console/integers.py (the agent's
    agent/integers.py, the CLI's cli/integers.py) and nowhere else."""
    assert _calls_named({"isdigit", "isdecimal", "isnumeric"}) == []


@pytest.mark.integration
def test_through_the_real_server_no_number_and_no_path_gives_a_500(stack, owner):
    """The same through the ASGI server `make run` starts: a websocket no route takes was a
    failed handshake (500), the terminal's size and a tail of other digits were server errors."""
    token = accounts.issue_token(owner.user, owner.tenant, "ws").raw
    headers = {"Authorization": f"Bearer {token}"}
    socket_url = f"ws://127.0.0.1:{stack.port}"

    async def close_code(path: str) -> tuple[int, str]:
        """The socket's close code and reason; a handshake refused before it was accepted
        answers its HTTP status (403 is how Channels refuses one, 500 a consumer that failed)."""
        try:
            async with websockets.connect(socket_url + path, additional_headers=headers) as ws:
                with pytest.raises(websockets.ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 10)
                return ws.close_code, ws.close_reason
        except websockets.InvalidStatus as refused:
            return refused.response.status_code, ""

    assert asyncio.run(close_code("/ws/nothing/"))[0] == 4404
    assert asyncio.run(close_code("/ws/instances/1/terminal/?cols=%D9%A8%D9%A0")) == (
        4400,
        "cols and rows: A whole number from 1 to 1000.",
    )
    assert asyncio.run(close_code(f"/ws/instances/{'9' * 30}/metrics/"))[0] in (403, 4404)
    for value in ("%C2%B2", "%D9%A3", "1%0A", "9" * 30):
        answer = httpx.get(f"{stack.url}/api/v1/instances/1/logs/?tail={value}", headers=headers)
        assert answer.status_code == 400 and "tail" in answer.json()["errors"], answer.text
        words_only(answer.text)
