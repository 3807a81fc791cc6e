"""The agents' samples endpoint served straight from the ASGI server (see samples.py).

The host's secret is checked before the body is read; the body is then read into at most
MAX_BODY_BYTES + 1 bytes (a Content-Length over the limit is refused before any)."""

import json

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from console.metrics.samples import MAX_BODY_BYTES, Refused, accept_body, authenticate, too_large

SAMPLES_PATH = "/agent/v1/samples"


def _in_thread(function):
    def run(*args):
        close_old_connections()  # what Django does around every request
        try:
            return function(*args)
        finally:
            close_old_connections()

    return sync_to_async(run, thread_sensitive=False)


_authenticate = _in_thread(authenticate)
_accept_body = _in_thread(accept_body)


async def _read_body(receive, limit: int) -> bytes | None:
    """The request body (Refused when longer than `limit`), or None when the client went away."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large()
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _answer(send, status: int, answer: dict) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(answer).encode()})


def with_samples_route(django_app):
    """An ASGI app that answers POST /agent/v1/samples itself and hands all else to Django."""

    async def app(scope, receive, send):
        if not (
            scope["type"] == "http" and scope["path"] == SAMPLES_PATH and scope["method"] == "POST"
        ):
            return await django_app(scope, receive, send)
        headers = dict(scope["headers"])
        try:
            host = await _authenticate(headers.get(b"authorization", b"").decode("latin-1"))
            length = headers.get(b"content-length", b"")
            if length.isdigit() and int(length) > MAX_BODY_BYTES:
                raise too_large()
            body = await _read_body(receive, MAX_BODY_BYTES)
        except Refused as refused:
            return await _answer(send, refused.status, refused.answer)
        if body is not None:
            await _answer(send, *await _accept_body(host, body))

    return app
