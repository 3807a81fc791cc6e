"""The one way the console sends Channels group messages from synchronous code: instance
states and notes (console.instances.lifecycle) and live metrics (console.metrics.ingest).

`async_to_sync(layer.group_send)` from a Celery worker (or any thread without an event loop)
starts a fresh loop per call, and channels_redis opens a connection per loop: ~60 ms a
message on a small machine, on the path of every transition. Here one daemon thread per
process runs a loop for good; messages go through one FIFO queue, so the tenant's browsers
see the transitions of an instance in the order they happened. Sending does not wait.

The in-memory layer (tests, single-process runs) lives on the caller's loop, so it keeps
the plain async_to_sync path.

The live metrics' hot path can do better still on a single Redis: `pubsub_wire` gives the
PUBLISHes that the layer's group_send would make, so that they ride in the pipeline that
writes the live window (one round trip a batch)."""

import asyncio
import logging
import os
import threading

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.conf import settings

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


def pubsub_wire(messages: list[tuple[str, dict]]) -> list[tuple[str, bytes]] | None:
    """The messages as (Redis channel, bytes) exactly as RedisPubSubChannelLayer.group_send
    would PUBLISH them, when the layer is that one on the single Redis of REDIS_URL (as
    settings configure it). None: send them with group_send.
    tests/metrics/test_publish.py checks the wire format against channels_redis itself."""
    layer = get_channel_layer()
    if not isinstance(layer, RedisPubSubChannelLayer) or not settings.REDIS_URL:
        return None
    config = settings.CHANNEL_LAYERS["default"].get("CONFIG", {})
    if config.get("hosts") != [settings.REDIS_URL]:
        return None
    prefix = config.get("prefix", "asgi")
    return [(f"{prefix}__group__{group}", layer.serialize(msg)) for group, msg in messages]


def _running():
    pid = os.getpid()
    with _lock:
        if pid not in _state:
            loop = asyncio.new_event_loop()
            queue_ready = threading.Event()
            holder: dict[str, asyncio.Queue] = {}

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
