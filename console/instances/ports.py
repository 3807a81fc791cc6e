"""An instance's web port (Jupyter, TensorBoard, an app) on an origin of its own,
`i{id}-{port}.PORTS_DOMAIN` (port_origin), served straight from the ASGI server in front of
Django: `by_host` sends every request whose Host names a port origin here (HTTP) or to
relay.PortSocketConsumer (websockets), and every other request to the console.

Everything on a port origin is the app's, the whole path as the client sent it, but for
port_origin.GRANT_PATH, where a console grant becomes the origin's own cookie. Who gets
through, checked again on every request and websocket (access.target): a member (role member
or above) of the instance's tenant, by that cookie or by a Bearer API token. The request goes
to the host's agent (agent_client.port_request) without the cookie and the Authorization
header, with the origin's host as X-Forwarded-Host (the app sees it as Host), both bodies
streamed (never held whole). An app's Set-Cookie keeps to its origin (no
Domain) and never names the origin's cookie. Refusals are small HTML pages for browsers and
JSON with `code` for API clients (a Bearer token, or Accept: application/json)."""

import asyncio
import contextlib
import json
import re
import time
from urllib.parse import parse_qs, urlsplit

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.db import close_old_connections
from django.template.loader import render_to_string

from accounts.models import Membership
from accounts.services import TokenRejected, authenticate_token
from console import activity, integers
from console.errors import ErrorCode
from console.fleet import agent_client
from console.instances import access, port_origin
from console.instances.relay import PortSocketConsumer
from console.socket_census import counted

# Never forwarded: the credentials of this origin, and what belongs to one hop only.
DROPPED_REQUEST = {
    b"authorization",
    b"host",
    b"connection",
    b"keep-alive",
    b"proxy-authorization",
    b"proxy-connection",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"x-forwarded-host",
    b"x-forwarded-proto",
}
DROPPED_RESPONSE = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-connection",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
}
# What the agent answers itself (not the app) when it cannot reach the container's port.
AGENT_ERRORS = {ErrorCode.PORT_UNREACHABLE: 502, ErrorCode.NOT_RUNNING: 409}
# The port origin's own pages (refusals, the grant's redirect): nothing to run, nothing to frame.
OWN_PAGE_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; "
        b"form-action 'none'; frame-ancestors 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
    (b"referrer-policy", b"no-referrer"),
]
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
_DOMAIN_ATTRIBUTE = re.compile(rb";\s*domain\s*=[^;]*", re.IGNORECASE)


def _header(scope, name: bytes) -> str:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == name), "")


def _bearer(scope) -> str | None:
    auth = _header(scope, b"authorization")
    return auth[len("Bearer ") :].strip() if auth.startswith("Bearer ") else None


def _own_cookies(scope) -> list[str]:
    name = port_origin.cookie_name()
    return [value for key, value in port_origin.cookie_pairs(scope) if key == name]


def _same_origin(scope) -> bool:
    """Whether the request names no other origin than its own (a browser sends Origin on
    every websocket and cross-origin request)."""
    origin = _header(scope, b"origin")
    return not origin or urlsplit(origin).netloc.lower() == _header(scope, b"host").lower()


def _wants_json(scope) -> bool:
    return _bearer(scope) is not None or "application/json" in _header(scope, b"accept")


def member(bearer: str | None, membership_id: int | None) -> tuple[Membership | None, int | None]:
    """The membership (and API token id) a request to a port origin acts as: its Bearer
    token's, else its cookie's (`membership_id`) while its user is active."""
    if bearer is not None:
        try:
            token, membership = authenticate_token(bearer)
        except TokenRejected:
            return None, None
        return membership, token.pk
    membership = (
        Membership.objects.select_related("tenant", "user")
        .filter(pk=membership_id, user__is_active=True)
        .first()
    )
    return membership, None


def _admit_in_thread(bearer, membership_id, pk: int, port: int) -> access.Target:
    close_old_connections()
    try:
        return access.target(member(bearer, membership_id)[0], pk, port)
    finally:
        close_old_connections()


def _redeem_in_thread(raw: str, pk: int, port: int) -> dict | None:
    return port_origin.redeem_grant(raw, pk, port)


_admit = sync_to_async(_admit_in_thread, thread_sensitive=False)
_redeem = sync_to_async(_redeem_in_thread, thread_sensitive=False)
_member = database_sync_to_async(member)


async def _answer(send, status: int, headers: list, body: bytes = b"") -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _refuse(scope, send, status: int, code: ErrorCode, detail: str, back: str) -> None:
    if _wants_json(scope):
        body = json.dumps({"code": code, "detail": detail}).encode()
        kind = b"application/json"
    else:
        context = port_origin.error_context(code, detail, back)
        body = render_to_string("ports/error.html", context).encode()
        kind = b"text/html; charset=utf-8"
    await _answer(send, status, [(b"content-type", kind), *OWN_PAGE_HEADERS], body)


async def _take_grant(scope, send, pk: int, port: int, console: str) -> None:
    """GRANT_PATH?g=…&next=/…: the console's grant becomes this origin's cookie."""
    query = parse_qs(scope["query_string"].decode("latin-1"))
    grant = await _redeem((query.get("g") or [""])[0], pk, port)
    if grant is None:
        detail = "This link was used already, is for another port, or is older than a minute."
        return await _refuse(scope, send, 403, ErrorCode.INVALID_GRANT, detail, _back(console, pk))
    secure = port_origin.cookie_name().startswith("__Host-")
    cookie = (
        f"{port_origin.cookie_name()}={port_origin.session_value(grant)}; Path=/; HttpOnly; "
        f"SameSite=Lax; Max-Age={port_origin.SESSION_SECONDS}{'; Secure' if secure else ''}"
    )
    location = port_origin.safe_next((query.get("next") or ["/"])[0])
    headers = [
        (b"location", location.encode("latin-1")),
        (b"set-cookie", cookie.encode("latin-1")),
        *OWN_PAGE_HEADERS,
    ]
    await _answer(send, 302, headers)


def _back(console: str, pk: int) -> str:
    return f"{console}/instances/{pk}/"


class _Body:
    """The request body as it arrives, for httpx to stream on."""

    def __init__(self, receive):
        self.receive = receive
        self.done = False
        self.disconnected = False

    async def __aiter__(self):
        while not self.done:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.done = self.disconnected = True
                return
            self.done = not message.get("more_body", False)
            chunk = message.get("body", b"")
            if chunk:
                yield chunk


async def _until_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def proxy(scope, receive, send) -> None:
    pk, port = scope["port_origin"]
    console = port_origin.console_url(scope.get("scheme", "http"), _header(scope, b"host"))
    if scope["path"] == port_origin.GRANT_PATH:
        return await _take_grant(scope, send, pk, port, console)
    bearer = _bearer(scope)
    session = None if bearer else port_origin.session_from(_own_cookies(scope), pk, port)
    console = session["c"] if session else console
    back = _back(console, pk)
    raw_path = scope["raw_path"].decode("latin-1")
    query = scope.get("query_string", b"").decode("latin-1")
    if bearer is None and session is None:
        if scope["method"] in ("GET", "HEAD") and not _wants_json(scope):  # get a grant first
            location = f"{console}/instances/{pk}/ports/{port}{raw_path}"
            location += f"?{query}" if query else ""
            return await _answer(send, 302, [(b"location", location.encode("latin-1"))])
        detail = "Open the port from the console, or send an API token."
        return await _refuse(scope, send, 401, ErrorCode.NOT_AUTHENTICATED, detail, back)
    if session is not None and scope["method"] not in SAFE_METHODS and not _same_origin(scope):
        detail = "A page of another site may not send this to the port."
        return await _refuse(scope, send, 403, ErrorCode.CROSS_ORIGIN, detail, back)
    try:
        target = await _admit(bearer, session and session["m"], pk, port)
    except access.ConnectRefused as refused:
        return await _refuse(scope, send, refused.status, refused.code, refused.detail, back)
    if activity.due(pk, "ports", time.time()):
        await sync_to_async(activity.used)(pk, "ports")
    headers = [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in scope["headers"]
        if name not in DROPPED_REQUEST and name != b"cookie"
    ] + port_origin.app_headers(scope)
    body = _Body(receive)
    sent = dict(scope["headers"])
    if sent.get(b"content-length", b"0") == b"0" and b"transfer-encoding" not in sent:
        body.done = True  # nothing to stream (a GET is not sent chunked)
    try:
        response = await agent_client.port_request(
            target.host,
            pk,
            port,
            raw_path[1:],
            query=query,
            method=scope["method"],
            headers=headers,
            content=b"" if body.done else body,
        )
    except agent_client.PortPathRefused as refused:
        return await _refuse(scope, send, 400, ErrorCode.INVALID_PATH, str(refused), back)
    except agent_client.AgentUnavailable:
        detail = "Its host is not answering."
        return await _refuse(scope, send, 502, ErrorCode.AGENT_UNAVAILABLE, detail, back)
    try:
        await _relay(scope, send, receive, response, body, port, back)
    finally:
        await response.aclose()


async def _relay(scope, send, receive, response, body, port: int, back: str) -> None:
    """The app's answer, or the agent's own error as the port origin's refusal."""
    first = b""
    kind = response.headers.get("content-type", "")
    try:
        small = integers.parse(response.headers.get("content-length", "")) <= 4096
    except integers.NotAWholeNumber:
        small = False
    if response.status_code in (404, 502) and kind.startswith("application/json") and small:
        first = b"".join([chunk async for chunk in response.aiter_raw()])
        with contextlib.suppress(ValueError, AttributeError):
            code = json.loads(first).get("error")
            if code in AGENT_ERRORS:
                detail = (
                    f"Nothing is listening on port {port} in the instance."
                    if code == ErrorCode.PORT_UNREACHABLE
                    else "Its container is not running on its host."
                )
                return await _refuse(scope, send, AGENT_ERRORS[code], ErrorCode(code), detail, back)
    await send(
        {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": list(_app_response_headers(response.headers.raw)),
        }
    )
    if first:
        await send({"type": "http.response.body", "body": first})
    else:
        await _stream(response, send, body, receive)


def _app_response_headers(raw):
    cookie = port_origin.cookie_name().lower().encode("latin-1")
    for name, value in raw:
        lowered = name.lower()
        if lowered in DROPPED_RESPONSE:
            continue
        if lowered == b"set-cookie":
            if value.partition(b"=")[0].strip().lower() == cookie:
                continue  # the origin's own cookie is not the app's to set
            value = _DOMAIN_ATTRIBUTE.sub(b"", value)  # the app's cookies stay on its origin
        yield name, value


async def _stream(response, send, body: _Body, receive) -> None:
    """The answer's body as it comes, until it ends or the client goes away."""

    async def pump():
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    pumping = asyncio.ensure_future(pump())
    waiters = {pumping}
    if body.done and not body.disconnected:
        waiters.add(asyncio.ensure_future(_until_disconnect(receive)))
    done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if pumping in done:
        pumping.result()


class _SocketMember:
    """Who opens a websocket on a port origin: a Bearer token's member, or the origin's
    cookie's when a page of this very origin opens it (Origin); nobody otherwise."""

    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        pk, port = scope["port_origin"]
        bearer = _bearer(scope)
        session = None
        if bearer is None and _same_origin(scope):
            session = port_origin.session_from(_own_cookies(scope), pk, port)
        membership, token_id = (None, None)
        if bearer is not None or session is not None:
            membership, token_id = await _member(bearer, session and session["m"])
        route = {"args": (), "kwargs": {"pk": pk, "port": port}}
        scope = {
            **scope,
            "membership": membership,
            "api_token_id": token_id,
            "url_route": route,
        }
        return await self.inner(scope, receive, send)


def by_host(console):
    """The ASGI app: a request whose Host names a port origin is the port's (HTTP and
    websockets), any other the `console` app's."""
    socket = _SocketMember(counted(PortSocketConsumer.as_asgi()))

    async def route(scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            found = port_origin.parse_host(_header(scope, b"host"))
            if found is not None:
                scope = {**scope, "port_origin": found}
                app = proxy if scope["type"] == "http" else socket
                return await app(scope, receive, send)
        return await console(scope, receive, send)

    return route
