"""The agents' samples endpoint served straight from the ASGI server (see fleet/samples.py)."""

import json

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from console.fleet.samples import MAX_BODY_BYTES, accept_batch

SAMPLES_PATH = "/agent/v1/samples"


def _accept(authorization: str, body: bytes) -> tuple[int, dict]:
    close_old_connections()  # what Django does around every request
    try:
        return accept_batch(authorization, body)
    finally:
        close_old_connections()


_accept_async = sync_to_async(_accept, thread_sensitive=False)


def with_samples_route(django_app):
    """An ASGI app that answers POST /agent/v1/samples itself and hands all else to Django."""

    async def app(scope, receive, send):
        if not (
            scope["type"] == "http" and scope["path"] == SAMPLES_PATH and scope["method"] == "POST"
        ):
            return await django_app(scope, receive, send)
        headers = dict(scope["headers"])
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > MAX_BODY_BYTES or not message.get("more_body"):
                break
        status, answer = await _accept_async(
            headers.get(b"authorization", b"").decode("latin-1"), body
        )
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": json.dumps(answer).encode()})

    return app
