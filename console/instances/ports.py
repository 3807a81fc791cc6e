"""/instances/{id}/ports/{port}/{path}: an instance's web port (Jupyter, TensorBoard, an
app) through the console, served straight from the ASGI server in front of Django.

Members (role member or above) of the instance's tenant only, by session cookie or Bearer
token; 404 for anyone else and for ports neither its image nor its launch declared. The
request goes to the host's agent (agent_client.port_request) without the console's cookies
and Authorization header, both bodies streamed (never held whole). Websockets on the same
paths are relayed by relay.PortSocketConsumer."""

import asyncio
import contextlib
import json
import re
from urllib.parse import quote

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections
from django.shortcuts import resolve_url

from accounts.websocket import TenantAuthHttp
from console.fleet import agent_client
from console.instances import access

PORT_PATH = re.compile(r"^/instances/(?P<pk>[0-9]+)/ports/(?P<port>[0-9]{1,5})(?P<rest>/.*)?$")

# Never forwarded: the console's credentials, and what belongs to one hop only.
DROPPED_REQUEST = {
    b"cookie",
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
}
DROPPED_RESPONSE = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
}


def _target_in_thread(membership, pk: int, port: int):
    close_old_connections()
    try:
        return access.target(membership, pk, port)
    finally:
        close_old_connections()


_target = sync_to_async(_target_in_thread, thread_sensitive=False)


async def _answer(send, status: int, body: dict, headers=()) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


async def _redirect(send, location: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 302,
            "headers": [(b"location", location.encode("latin-1"))],
        }
    )
    await send({"type": "http.response.body", "body": b""})


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
    match = PORT_PATH.match(scope["path"])
    pk, port = int(match["pk"]), int(match["port"])
    if not match["rest"]:  # the app's relative links need the trailing slash
        query = scope.get("query_string", b"").decode("latin-1")
        return await _redirect(send, scope["path"] + "/" + (f"?{query}" if query else ""))
    membership = scope.get("membership")
    signed_in = getattr(scope.get("user"), "is_authenticated", False)
    browsing = scope["method"] in ("GET", "HEAD") and b"authorization" not in dict(scope["headers"])
    if membership is None and not signed_in and browsing:  # sign in first, then come back
        next_url = quote(scope["path"], safe="/")
        return await _redirect(send, f"{resolve_url(settings.LOGIN_URL)}?next={next_url}")
    try:
        target = await _target(membership, pk, port)
    except access.Refused as refused:
        return await _answer(
            send, refused.status, {"error": refused.code, "detail": refused.detail}
        )
    path = match["rest"][1:]
    query = scope.get("query_string", b"").decode("latin-1")
    if query:
        path = f"{path}?{query}"
    headers = [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in scope["headers"]
        if name not in DROPPED_REQUEST
    ]
    body = _Body(receive)
    sent = dict(scope["headers"])
    if sent.get(b"content-length", b"0") == b"0" and b"transfer-encoding" not in sent:
        body.done = True  # nothing to stream (a GET is not sent chunked)
    try:
        response = await agent_client.port_request(
            target.host,
            pk,
            port,
            path,
            method=scope["method"],
            headers=headers,
            content=b"" if body.done else body,
        )
    except agent_client.AgentUnavailable:
        return await _answer(
            send, 502, {"error": "agent_unavailable", "detail": "Its host is not answering."}
        )
    try:
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": [
                    (name, value)
                    for name, value in response.headers.raw
                    if name.lower() not in DROPPED_RESPONSE
                ],
            }
        )
        await _stream(response, send, body, receive)
    finally:
        await response.aclose()


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


def with_ports_route(app):
    """An ASGI app that serves /instances/{id}/ports/{port}/… itself and hands the rest on."""
    authenticated = TenantAuthHttp(proxy)

    async def route(scope, receive, send):
        if scope["type"] == "http" and PORT_PATH.match(scope["path"]):
            return await authenticated(scope, receive, send)
        return await app(scope, receive, send)

    return route
