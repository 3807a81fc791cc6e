"""/agent/v1/samples/stream: an agent's batches over a websocket, each frame a POST body with an
answer frame of its own, in order; the secret checked before the socket is accepted and again
within REAUTH_SECONDS."""

import asyncio
import json
import time

import pytest

from console.instances.models import Allocation
from console.metrics import asgi, ingest, live
from console.metrics.asgi import REFUSED_CLOSE_CODE, STREAM_PATH, with_samples_stream
from tests.metrics.conftest import gpu_sample

pytestmark = pytest.mark.django_db(transaction=True)


def stream(secret: str, frames: list, between=None) -> list[dict]:
    """What the console sends an agent that connects with `secret` and sends `frames` (bytes or
    text) one after another, each after the previous one's answer; `between(n)` runs before
    frame n is sent."""
    sent: list[dict] = []
    incoming = [{"type": "websocket.connect"}]
    incoming += [
        {"type": "websocket.receive", "bytes": f} if isinstance(f, bytes) else
        {"type": "websocket.receive", "text": f}
        for f in frames
    ]  # fmt: skip
    incoming.append({"type": "websocket.disconnect", "code": 1000})
    frame_number = 0

    async def receive():
        nonlocal frame_number
        message = incoming.pop(0)
        if message["type"] == "websocket.receive":
            if between is not None:
                await asyncio.to_thread(between, frame_number)
            frame_number += 1
        return message

    async def send(message):
        sent.append(message)

    async def others(scope, receive, send):
        raise AssertionError("the stream answers itself")

    scope = {
        "type": "websocket",
        "path": STREAM_PATH,
        "headers": [(b"authorization", f"Bearer {secret}".encode())],
    }
    asyncio.run(with_samples_stream(others)(scope, receive, send))
    return sent


def answers(sent: list[dict]) -> list[dict]:
    return [json.loads(m["text"]) for m in sent if m["type"] == "websocket.send"]


def batch(host, *samples) -> str:
    return json.dumps({"host_id": host.pk, "samples": list(samples)})


def test_a_wrong_secret_is_refused_before_the_socket_is_accepted(world):
    now = time.time()
    sent = stream("not-a-secret", [batch(world.host, gpu_sample(now, 0))])
    assert sent == [{"type": "websocket.close", "code": REFUSED_CLOSE_CODE}]
    assert live.store().window(ingest.gpu_series(world.host.pk, 0)) == []


def test_frames_are_answered_in_order_and_a_bad_one_does_not_end_the_stream(world):
    now = time.time()
    series = ingest.gpu_series(world.host.pk, 0)
    sent = stream(
        "secret-of-host-a",
        [
            batch(world.host, gpu_sample(now, 0, util=10.0)),
            "[{",  # not JSON
            batch(world.host_b, gpu_sample(now, 0, host="host-b")),  # another host's id
            batch(world.host, gpu_sample(now + 1, 0, util=11.0)).encode(),  # a binary frame
        ],
    )
    assert sent[0] == {"type": "websocket.accept"}
    got = answers(sent)
    assert got[0] == {"status": 202, "accepted": 1, "ignored": 0}
    assert (got[1]["status"], got[1]["code"]) == (400, "parse_error")
    assert (got[2]["status"], got[2]["code"]) == (403, "wrong_host")
    assert got[3] == {"status": 202, "accepted": 1, "ignored": 0}
    assert [row[:2] for row in live.store().window(series)] == [[now, 10.0], [now + 1, 11.0]]


def test_a_host_rekeyed_while_streaming_is_cut_off_at_the_next_check(world, monkeypatch):
    monkeypatch.setattr(asgi, "REAUTH_SECONDS", 0.0)
    now = time.time()

    def rekey(frame_number):
        if frame_number == 1:
            world.host.set_secret("a-new-secret")
            world.host.save()

    sent = stream(
        "secret-of-host-a",
        [batch(world.host, gpu_sample(now, 0)), batch(world.host, gpu_sample(now + 1, 0))],
        between=rekey,
    )
    assert answers(sent) == [{"status": 202, "accepted": 1, "ignored": 0}]
    assert sent[-1]["type"] == "websocket.close"
    assert sent[-1]["code"] == REFUSED_CLOSE_CODE
    window = live.store().window(ingest.gpu_series(world.host.pk, 0))
    assert [row[0] for row in window] == [now]  # the frame after the re-key was not taken


def test_a_deleted_host_is_cut_off_at_the_next_check(world, monkeypatch):
    monkeypatch.setattr(asgi, "REAUTH_SECONDS", 0.0)
    now = time.time()
    host_b = world.host_b

    def delete(frame_number):
        if frame_number == 1:
            Allocation.objects.filter(host=host_b).delete()
            type(host_b).objects.filter(pk=host_b.pk).delete()

    sent = stream(
        "secret-of-host-b",
        [
            batch(host_b, gpu_sample(now, 0, host="host-b")),
            batch(host_b, gpu_sample(now + 1, 0, host="host-b")),
        ],
        between=delete,
    )
    assert len(answers(sent)) == 1
    assert sent[-1]["code"] == REFUSED_CLOSE_CODE


def test_streams_opened_together_are_checked_again_at_different_moments():
    """Within REAUTH_SECONDS, and spread: every agent reconnects together after a restart."""
    now = time.monotonic()
    due = sorted(asgi._next_check() - now for _ in range(200))
    assert due[0] >= 0.75 * asgi.REAUTH_SECONDS - 0.01
    assert due[-1] <= asgi.REAUTH_SECONDS + 0.01
    assert due[-1] - due[0] > asgi.REAUTH_SECONDS / 8
