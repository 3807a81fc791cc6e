"""Send Channels group messages from synchronous code without paying for a new event loop
and a new Redis connection each time.

`async_to_sync(layer.group_send)` from a Celery worker (or any thread without an event loop)
starts a fresh loop per call, and channels_redis opens a connection per loop: ~60 ms a
message on a small machine, on the path of every transition. Here one daemon thread per
process runs a loop for good; messages go through one FIFO queue, so the tenant's browsers
see the transitions of an instance in the order they happened. Sending does not wait.

The in-memory layer (tests, single-process runs) lives on the caller's loop, so it keeps
the plain async_to_sync path."""

import asyncio
import logging
import os
import threading

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer

log = logging.getLogger(__name__)

_lock = threading.Lock()
_state: dict = {}  # pid → (loop, queue): a forked child starts its own


def group_send(group: str, message: dict) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    if isinstance(layer, InMemoryChannelLayer):
        async_to_sync(layer.group_send)(group, message)
        return
    loop, queue = _running()
    loop.call_soon_threadsafe(queue.put_nowait, (layer, group, message))


def _running():
    pid = os.getpid()
    with _lock:
        if pid not in _state:
            loop = asyncio.new_event_loop()
            queue_ready = threading.Event()
            holder = {}

            def serve():
                asyncio.set_event_loop(loop)
                holder["queue"] = asyncio.Queue()
                queue_ready.set()
                loop.run_until_complete(_drain(holder["queue"]))

            threading.Thread(target=serve, name="channels-broadcast", daemon=True).start()
            queue_ready.wait()
            _state[pid] = (loop, holder["queue"])
        return _state[pid]


async def _drain(queue: asyncio.Queue) -> None:
    while True:
        layer, group, message = await queue.get()
        try:
            await layer.group_send(group, message)
        except Exception:  # a lost live update is not worth more: the database is the truth
            log.warning("could not send to %s", group, exc_info=True)
