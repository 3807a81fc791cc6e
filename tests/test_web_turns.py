"""Django's requests in a web process take turns, WEB_REQUEST_CONCURRENCY at a time, in the
real ASGI application: the ones over the limit wait for a turn and are answered, none is
refused."""

import asyncio
import os
import subprocess
import sys
import threading

import pytest
from django.conf import settings
from django.core.signals import request_finished, request_started

from console.asgi import application


async def get(path: str) -> int:
    """One GET through the ASGI application, as uvicorn hands it over; its status."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
    }  # fmt: skip
    messages = [{"type": "http.request", "body": b"", "more_body": False}]
    answered = asyncio.Event()
    status = []

    async def receive():
        if messages:
            return messages.pop()
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            status.append(message["status"])
        elif not message.get("more_body"):
            answered.set()

    await application(scope, receive, send)
    return status[0]


@pytest.mark.django_db(transaction=True)
def test_requests_over_the_limit_wait_their_turn_and_all_are_answered():
    lock = threading.Lock()
    running, most = 0, 0

    def started(**kwargs):
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)

    def finished(**kwargs):
        nonlocal running
        with lock:
            running -= 1

    async def many() -> list[int]:
        together = asyncio.gather(*(get("/api/v1/instances/") for _ in range(24)))
        return await asyncio.wait_for(together, timeout=60)

    request_started.connect(started)
    request_finished.connect(finished)
    try:
        statuses = asyncio.run(many())
    finally:
        request_started.disconnect(started)
        request_finished.disconnect(finished)
    assert statuses == [401] * 24
    assert 1 < most <= settings.WEB_REQUEST_CONCURRENCY
    assert running == 0


@pytest.mark.integration
def test_a_web_process_keeps_what_it_loaded_out_of_the_collectors_sight():
    """A full garbage collection stops every request's thread: in a web process it walks only
    what requests made, not the ~170,000 objects loaded at startup. Measured against the same
    process's collection once they are thawed (the baseline: machines differ in speed)."""
    code = (
        "import gc, time; import console.asgi\n"
        "def timed():\n"
        "    start = time.perf_counter(); gc.collect(); return time.perf_counter() - start\n"
        "frozen = gc.get_freeze_count(); timed(); kept = min(timed() for _ in range(3))\n"
        "gc.unfreeze(); timed(); thawed = min(timed() for _ in range(3))\n"
        "print(frozen, kept, thawed)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings"}
    answer = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    frozen, kept, thawed = answer.stdout.split()
    assert int(frozen) > 100_000
    assert float(kept) < float(thawed) / 3, (kept, thawed)
