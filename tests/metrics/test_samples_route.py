"""POST /agent/v1/samples on the console's direct ASGI route: a batch small enough to sit in the
server's buffer already is read, then checked together with the secret; a wrong secret still
gets its 401 and nothing of the batch is kept."""

import asyncio
import json
import time

import pytest

from console.metrics import ingest, live
from console.metrics.asgi import READ_AHEAD_BYTES, with_samples_route
from tests.metrics.conftest import gpu_sample

pytestmark = pytest.mark.django_db(transaction=True)


def post(secret: str, body: bytes) -> tuple[int, dict]:
    chunks = [body[n : n + 1000] for n in range(0, len(body), 1000)]
    sent = []

    async def receive():
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message):
        sent.append(message)

    async def django_app(scope, receive, send):
        raise AssertionError("the samples route answers itself")

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/agent/v1/samples",
        "headers": [
            (b"authorization", f"Bearer {secret}".encode()),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    asyncio.run(with_samples_route(django_app)(scope, receive, send))
    return sent[0]["status"], json.loads(sent[1]["body"])


def test_a_small_batch_is_taken_with_its_hosts_secret_only(world):
    now = time.time()
    body = json.dumps({"host_id": world.host.pk, "samples": [gpu_sample(now, 0, util=42.0)]})
    assert len(body) < READ_AHEAD_BYTES
    series = ingest.gpu_series(world.host.pk, 0)

    status, answer = post("secret-of-host-b", body.encode())  # another host's secret
    assert (status, answer["code"]) == (403, "wrong_host")
    status, answer = post("not-a-secret", body.encode())
    assert (status, answer["code"]) == (401, "invalid_secret")
    assert live.store().window(series) == []

    assert post("secret-of-host-a", body.encode()) == (202, {"accepted": 1, "ignored": 0})
    assert [row[:2] for row in live.store().window(series)] == [[now, 42.0]]
