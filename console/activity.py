"""When each instance was last used through the console's own doors: SSH sessions (the agent's
gateway tells of each one opening and ending), browser terminals and port requests. The idle
watch (console.idle) reads it to tell an idle instance from one somebody uses.

Kept in the cache (Redis when distributed, shared by every web process and worker), never in a
database row, so the hot paths pay one cache write at most: per instance and signal, how many
sessions are open now and when it was last used (epoch seconds). Port requests are many: each
process writes at most one every USE_THROTTLE_SECONDS per instance. The keys expire a week
after their last change, so a session whose end was never heard of cannot hold an instance
busy for ever."""

import threading
import time

from django.core.cache import cache

SIGNALS = ("ssh", "terminal", "ports")
KEEP_SECONDS = 7 * 24 * 3600
USE_THROTTLE_SECONDS = 5.0

_written: dict[tuple[int, str], float] = {}
_written_lock = threading.Lock()


def _open_key(instance_pk: int, signal: str) -> str:
    return f"activity:{instance_pk}:{signal}:open"


def _last_key(instance_pk: int, signal: str) -> str:
    return f"activity:{instance_pk}:{signal}:last"


def opened(instance_pk: int, signal: str) -> None:
    """A session (ssh, terminal) into the instance opened."""
    key = _open_key(instance_pk, signal)
    cache.add(key, 0, KEEP_SECONDS)
    cache.incr(key)
    cache.set(_last_key(instance_pk, signal), time.time(), KEEP_SECONDS)


def ended(instance_pk: int, signal: str) -> None:
    """A session into the instance ended (never counted below none open)."""
    key = _open_key(instance_pk, signal)
    cache.add(key, 0, KEEP_SECONDS)
    if cache.decr(key) < 0:
        cache.set(key, 0, KEEP_SECONDS)
    cache.set(_last_key(instance_pk, signal), time.time(), KEEP_SECONDS)


def due(instance_pk: int, signal: str, now: float) -> bool:
    """Whether this process last wrote the instance's use of `signal` long enough ago to write
    it again (answering yes counts the write as done): checked in memory, before `used`."""
    with _written_lock:
        if now - _written.get((instance_pk, signal), float("-inf")) < USE_THROTTLE_SECONDS:
            return False
        _written[(instance_pk, signal)] = now
        return True


def used(instance_pk: int, signal: str) -> None:
    """A request reached the instance (through a port) now."""
    cache.set(_last_key(instance_pk, signal), time.time(), KEEP_SECONDS)


def seen(instance_pk: int) -> dict[str, tuple[int, float | None]]:
    """Per signal: (sessions open now, when last used as epoch seconds or None)."""
    keys = {
        signal: (_open_key(instance_pk, signal), _last_key(instance_pk, signal))
        for signal in SIGNALS
    }
    found = cache.get_many([key for pair in keys.values() for key in pair])
    return {
        signal: (max(0, int(found.get(open_key) or 0)), found.get(last_key))
        for signal, (open_key, last_key) in keys.items()
    }
