"""Counters that /metrics exposes and other processes add to: Celery task outcomes and billing
job runs (counted in the worker), launch latencies and failures (counted wherever the
transition commits: a worker or a web process).

With REDIS_URL they are one Redis hash, `<DEPLOYMENT_NAME>:opsmetrics:counters`, that every
process adds to with HINCRBYFLOAT (atomic, so concurrent workers never lose a count) and that
the scrape reads with one HGETALL, whichever web process serves it. A Redis restart starts
them from zero, which Prometheus' rate() reads as a counter reset. Without REDIS_URL (tests,
`manage.py` one-offs: a single process) they live in this process.

A field is the JSON of `[name, {label: value}]`; a histogram is its cumulative buckets
(`<name>_bucket` with `le`) and `<name>_sum`; its count is its `+Inf` bucket."""

import json
import math
import threading
from collections import defaultdict

from django.conf import settings

# Launches and billing jobs take from about a second to several minutes.
SECONDS_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, math.inf)

_local: dict[str, float] = defaultdict(float)
_local_lock = threading.Lock()
_client = None


def _redis():
    global _client
    if _client is None:
        import redis

        _client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2
        )
    return _client


def key() -> str:
    return f"{settings.DEPLOYMENT_NAME}:opsmetrics:counters"


def field(name: str, labels: dict[str, str]) -> str:
    return json.dumps([name, dict(sorted(labels.items()))], separators=(",", ":"))


def add(changes: dict[str, float]) -> None:
    """Add each amount to its field (from `field`), at once."""
    if settings.REDIS_URL:
        pipe = _redis().pipeline(transaction=False)
        for name, amount in changes.items():
            pipe.hincrbyfloat(key(), name, amount)
        pipe.execute()
        return
    with _local_lock:
        for name, amount in changes.items():
            _local[name] += amount


def put(name: str, labels: dict[str, str], value: float) -> None:
    """Set a gauge (the time a job last succeeded, say)."""
    if settings.REDIS_URL:
        _redis().hset(key(), field(name, labels), value)
        return
    with _local_lock:
        _local[field(name, labels)] = value


def count(name: str, labels: dict[str, str], amount: float = 1) -> None:
    add({field(name, labels): amount})


def observe(name: str, labels: dict[str, str], value: float, buckets=SECONDS_BUCKETS) -> None:
    """One observation of a histogram."""
    changes = {
        field(f"{name}_bucket", {**labels, "le": le(bound)}): 1
        for bound in buckets
        if value <= bound
    }
    changes[field(f"{name}_sum", labels)] = value
    add(changes)


def le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def read() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(name, sorted labels) → value of every field."""
    if settings.REDIS_URL:
        raw = {f.decode(): float(v) for f, v in _redis().hgetall(key()).items()}
    else:
        with _local_lock:
            raw = dict(_local)
    values = {}
    for name, value in raw.items():
        metric, labels = json.loads(name)
        values[(metric, tuple(sorted(labels.items())))] = value
    return values


def reset() -> None:
    """Forget every counter and the configured client (tests)."""
    global _client
    with _local_lock:
        _local.clear()
    if settings.REDIS_URL:
        _redis().delete(key())
    _client = None
