"""The thread where a web process takes the agents' batches (console/metrics/asgi.py).

Every batch of a process is taken in this one thread, in turn: with the default pool's threads
the batches only took turns for the GIL, and each turn was a thread switch. The thread waits
GATHER_SECONDS after a batch arrives, then takes every batch that is there together: checked
and ingested one by one, then written to the live window (and published) in one call to Redis
for all of them (live.writes_together). A round trip to Redis cost ~90 µs of CPU on this
project's 2-core virtual machines (a PING, in a loop), as much as ingesting a batch of eight
GPUs; at 5,000 GPUs, 5 ms of gathering took the servers from 0.86 to 0.67 cores and the p99
from 198 to 69 ms (bench/metrics.py --runs scaling).

A batch's answer comes after the group's write: an agent hears 202 only once its samples are
in the window. When the write fails, every batch of the group gets its error."""

import asyncio
import contextlib
import queue
import threading
import time

from django.db import close_old_connections

from console.metrics import live

MAX_GROUP = 64
GATHER_SECONDS = 0.005
# Django's check of the thread's database connections (what it does around every request):
# before a group, at most this often, and after a group where anything failed. A check costs
# ~45 µs of CPU (asgiref's thread-critical locals), as much as checking three batches.
TIDY_SECONDS = 1.0


class Intake:
    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    async def call(self, function, *args):
        """`function(*args)`'s result (or exception), computed in the intake's thread."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._start()
        self._queue.put((function, args, loop, future))
        return await future

    def _start(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._serve, name="agent-samples", daemon=True
                    )
                    self._thread.start()

    def _serve(self) -> None:
        tidied = float("-inf")
        while True:
            group = [self._queue.get()]
            time.sleep(GATHER_SECONDS)
            while len(group) < MAX_GROUP:
                try:
                    group.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if time.monotonic() - tidied >= TIDY_SECONDS:
                close_old_connections()
                tidied = time.monotonic()
            outcomes = take(group)
            if not all(succeeded for succeeded, _ in outcomes):
                tidied = float("-inf")
            by_loop: dict = {}
            for (_, _, loop, future), outcome in zip(group, outcomes, strict=True):
                by_loop.setdefault(loop, []).append((future, outcome))
            for loop, settled in by_loop.items():
                # a loop closed meanwhile (a server stopping) has nobody waiting any more
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_settle, settled)


def take(group: list) -> list[tuple[bool, object]]:
    """(succeeded, result or exception) of each `(function, args, ...)` of the group, their
    writes to the live window made together at the end."""
    outcomes: list[tuple[bool, object]] = []
    try:
        with live.writes_together():
            for function, args, *_ in group:
                try:
                    outcomes.append((True, function(*args)))
                except Exception as exc:  # noqa: BLE001 - it is that batch's answer, raised there
                    outcomes.append((False, exc))
    except Exception as exc:  # noqa: BLE001 - the group's write failed: every batch is told
        outcomes = [(False, exc)] * len(group)
    return outcomes


def _settle(settled: list) -> None:
    for future, (succeeded, value) in settled:
        if future.cancelled():
            continue
        if succeeded:
            future.set_result(value)
        else:
            future.set_exception(value)


intake = Intake()
