"""How many websocket clients are connected, by kind of consumer (`terminal`, `tenant_events`,
`instance_metrics` …): /metrics' `gpucloud_websocket_clients{kind}`.

Each web process counts its own sockets (`counted` wraps a consumer's ASGI app: a socket counts
from its accept to its end). With REDIS_URL each process keeps its counts in a Redis hash of its
own, `<DEPLOYMENT_NAME>:opsmetrics:ws:<host>:<pid>`, rewritten at once on a change and every
REFRESH_SECONDS while it has sockets, and expiring TTL_SECONDS later: a process that dies takes
its sockets out of the sum within that time. The scrape sums the hashes of every process.
Without REDIS_URL (one process) the scrape reads this process's counts."""

import asyncio
import contextlib
import logging
import os
import re
import socket
from collections import Counter

from django.conf import settings
from redis.exceptions import RedisError

REFRESH_SECONDS = 10.0
TTL_SECONDS = 30

log = logging.getLogger(__name__)

_counts: Counter[str] = Counter()
_wake: asyncio.Event | None = None
_writer: asyncio.Task | None = None


def kind_of(consumer_class: type) -> str:
    """TerminalConsumer → terminal, TenantEventsConsumer → tenant_events."""
    name = consumer_class.__name__.removesuffix("Consumer")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def counted(app):
    """`app` (a consumer's `as_asgi()`), its accepted sockets counted by its consumer's kind."""
    kind = kind_of(app.consumer_class)

    async def census(scope, receive, send):
        accepted = False

        async def counting_send(message):
            nonlocal accepted
            await send(message)
            if message.get("type") == "websocket.accept" and not accepted:
                accepted = True
                _change(kind, 1)

        try:
            return await app(scope, receive, counting_send)
        finally:
            if accepted:
                _change(kind, -1)

    census.consumer_class = app.consumer_class
    return census


def _change(kind: str, delta: int) -> None:
    global _wake, _writer
    _counts[kind] += delta
    if not settings.REDIS_URL:
        return
    loop = asyncio.get_running_loop()
    if _writer is None or _writer.done() or _writer.get_loop() is not loop:
        _wake = asyncio.Event()
        _writer = loop.create_task(_publish(_wake))
    _wake.set()


def key_prefix() -> str:
    return f"{settings.DEPLOYMENT_NAME}:opsmetrics:ws:"


async def _publish(wake: asyncio.Event) -> None:
    """Keep this process's hash up to date while it has sockets; delete it when it has none."""
    import redis.asyncio as aioredis

    key = f"{key_prefix()}{socket.gethostname()}:{os.getpid()}"
    client = aioredis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
    try:
        while True:
            wake.clear()
            now = {kind: n for kind, n in _counts.items() if n > 0}
            try:
                pipe = client.pipeline(transaction=True)
                pipe.delete(key)
                if now:
                    pipe.hset(key, mapping=now)
                    pipe.expire(key, TTL_SECONDS)
                await pipe.execute()
            except (OSError, RedisError):
                log.warning("could not publish the websocket counts", exc_info=True)
            if not now and not wake.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), REFRESH_SECONDS)
    finally:
        await client.aclose()


def connected() -> dict[str, int]:
    """kind → connected clients, over every web process of the deployment."""
    if not settings.REDIS_URL:
        return {kind: n for kind, n in _counts.items() if n > 0}
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
    total: Counter[str] = Counter()
    try:
        keys = list(client.scan_iter(match=key_prefix() + "*", count=100))
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        for counts in pipe.execute():
            for kind, n in counts.items():
                total[kind.decode()] += int(n)
    finally:
        client.close()
    return dict(total)
