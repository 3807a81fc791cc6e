"""The agents' samples endpoint served straight from the ASGI server (see samples.py).

The host's secret is checked before the body is parsed, and before more of it is read than
the server has buffered anyway: a body declared at most READ_AHEAD_BYTES long (uvicorn reads
that much ahead of the application) is taken whole, then checked with the secret in one
thread hop; any other body is read only after the secret was checked, into at most
MAX_BODY_BYTES + 1 bytes (a Content-Length over the limit is refused before any).

The synchronous part (the secret's lookup, the batch's checks, the live window's write) runs
in the intake's thread (console/metrics/intake.py), which writes the batches that waited
together.

Agents send their batches over a websocket, `/agent/v1/samples/stream`, when the console has it:
the secret is checked before the socket is accepted (a wrong one gets the handshake refused),
then each frame is one POST body and gets one answer frame, `{"status": 202, "accepted": ...}`
or `{"status": 400, "code": ..., "detail": ...}`, in order. A POST costs the agent ~1.5 ms of
CPU in httpx and the console a request; a frame and its answer ~0.3 ms (both measured against a
bare uvicorn app, 2,000 in a row). The secret is checked again, and the host's GPUs read again,
within REAUTH_SECONDS of the last check: a re-keyed or deleted host's socket is closed (4401) at
its next frame after that. Each socket's next check falls at a random moment of the period's
last quarter: sockets opened together (every agent, after the console restarts) would otherwise
be checked together for good, 625 checks of ~0.6 ms in the same second of a server's every
eleven (at 10,000 GPUs: a 1 s stall, bench/metrics.py)."""

import random
import time
from functools import partial

import orjson

from console import integers
from console.metrics.intake import intake
from console.metrics.samples import (
    MAX_BODY_BYTES,
    BatchRefused,
    accept_body,
    authenticate,
    too_large,
)

SAMPLES_PATH = "/agent/v1/samples"
STREAM_PATH = "/agent/v1/samples/stream"
REAUTH_SECONDS = 10.0
REFUSED_CLOSE_CODE = 4401
READ_AHEAD_BYTES = 64 * 1024  # uvicorn's flow-control high-water mark


def authenticated_body(authorization: str, body: bytes) -> tuple[int, dict]:
    try:
        host = authenticate(authorization)
    except BatchRefused as refused:
        return refused.status, refused.answer
    return accept_body(host, body)


_authenticate = partial(intake.call, authenticate)
_accept_body = partial(intake.call, accept_body)
_accept_request = partial(intake.call, authenticated_body)


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
    await send({"type": "http.response.body", "body": orjson.dumps(answer)})


def _length(header: bytes) -> int | None:
    """The Content-Length a request says, None when it says none that is a number."""
    try:
        return integers.parse(header.decode("latin-1"))
    except integers.NotAWholeNumber:
        return None


def with_samples_route(django_app):
    """An ASGI app that answers POST /agent/v1/samples itself and hands all else to Django."""

    async def app(scope, receive, send):
        if not (
            scope["type"] == "http" and scope["path"] == SAMPLES_PATH and scope["method"] == "POST"
        ):
            return await django_app(scope, receive, send)
        headers = dict(scope["headers"])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        length = _length(headers.get(b"content-length", b""))
        try:
            if length is not None and length <= READ_AHEAD_BYTES:
                body = await _read_body(receive, READ_AHEAD_BYTES)
                if body is not None:
                    await _answer(send, *await _accept_request(authorization, body))
                return
            host = await _authenticate(authorization)
            if length is not None and length > MAX_BODY_BYTES:
                raise too_large()
            body = await _read_body(receive, MAX_BODY_BYTES)
        except BatchRefused as refused:
            return await _answer(send, refused.status, refused.answer)
        if body is not None:
            await _answer(send, *await _accept_body(host, body))

    return app


def _frame_body(message: dict) -> bytes:
    if message.get("bytes") is not None:
        return message["bytes"]
    return (message.get("text") or "").encode()


def _next_check() -> float:
    return time.monotonic() + REAUTH_SECONDS * random.uniform(0.75, 1.0)  # noqa: S311 - a spread


async def _stream(scope, receive, send) -> None:
    """One agent's sample stream: checked at the handshake, then a frame in, an answer out."""
    if (await receive())["type"] != "websocket.connect":
        return
    authorization = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
    try:
        host = await _authenticate(authorization)
    except BatchRefused:
        return await send({"type": "websocket.close", "code": REFUSED_CLOSE_CODE})
    check_at = _next_check()
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] != "websocket.receive":
            return
        if time.monotonic() >= check_at:
            try:
                host = await _authenticate(authorization)
            except BatchRefused as refused:
                reason = refused.detail[:120]
                return await send(
                    {"type": "websocket.close", "code": REFUSED_CLOSE_CODE, "reason": reason}
                )
            check_at = _next_check()
        status, answer = await _accept_body(host, _frame_body(message))
        text = orjson.dumps({"status": status, **answer}).decode()
        await send({"type": "websocket.send", "text": text})


def with_samples_stream(websocket_app):
    """An ASGI websocket app that takes /agent/v1/samples/stream itself and hands all else to
    `websocket_app`."""

    async def app(scope, receive, send):
        if scope["type"] == "websocket" and scope["path"] == STREAM_PATH:
            return await _stream(scope, receive, send)
        return await websocket_app(scope, receive, send)

    return app
