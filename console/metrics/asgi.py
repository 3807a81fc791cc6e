"""The agents' samples endpoint served straight from the ASGI server (see samples.py).

The host's secret is checked before the body is parsed, and before more of it is read than
the server has buffered anyway: a body declared at most READ_AHEAD_BYTES long (uvicorn reads
that much ahead of the application) is taken whole, then checked with the secret in one
thread hop; any other body is read only after the secret was checked, into at most
MAX_BODY_BYTES + 1 bytes (a Content-Length over the limit is refused before any).

The synchronous part (the secret's lookup, the batch's checks, the live window's pipeline:
a few milliseconds of CPU a batch) runs in one thread of its own per process. With the
default pool's threads the batches only took turns for the GIL, and each turn was a thread
switch: at 1,000 GPUs the server processes switched threads about twice as often, and a
sample waited longer in them (bench/metrics.py)."""

import json
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from console.metrics.samples import (
    MAX_BODY_BYTES,
    BatchRefused,
    accept_body,
    authenticate,
    too_large,
)

SAMPLES_PATH = "/agent/v1/samples"
READ_AHEAD_BYTES = 64 * 1024  # uvicorn's flow-control high-water mark
_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-samples")


def _in_thread(function):
    def run(*args):
        close_old_connections()  # what Django does around every request
        try:
            return function(*args)
        finally:
            close_old_connections()

    return sync_to_async(run, thread_sensitive=False, executor=_thread)


def authenticated_body(authorization: str, body: bytes) -> tuple[int, dict]:
    try:
        host = authenticate(authorization)
    except BatchRefused as refused:
        return refused.status, refused.answer
    return accept_body(host, body)


_authenticate = _in_thread(authenticate)
_accept_body = _in_thread(accept_body)
_accept_request = _in_thread(authenticated_body)


async def _read_body(receive, limit: int) -> bytes | None:
    """The request body (BatchRefused when longer than `limit`), or None when the client went
    away."""
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
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        length = headers.get(b"content-length", b"")
        try:
            if length.isdigit() and int(length) <= READ_AHEAD_BYTES:
                body = await _read_body(receive, READ_AHEAD_BYTES)
                if body is not None:
                    await _answer(send, *await _accept_request(authorization, body))
                return
            host = await _authenticate(authorization)
            if length.isdigit() and int(length) > MAX_BODY_BYTES:
                raise too_large()
            body = await _read_body(receive, MAX_BODY_BYTES)
        except BatchRefused as refused:
            return await _answer(send, refused.status, refused.answer)
        if body is not None:
            await _answer(send, *await _accept_body(host, body))

    return app
