"""The live window: every series' samples of the last settings.METRICS_LIVE_WINDOW_SECONDS at full
rate, the latest sample of each series (what /metrics exposes), and the minutes that still need
downsampling into the history.

With REDIS_URL it lives in Redis, shared by every ASGI server and Celery worker. Without it (the
single-process case: unit tests, `manage.py` one-offs) it lives in this process.

Redis keys (prefix `<settings.DEPLOYMENT_NAME>:metrics:`, so that deployments sharing a Redis keep
windows of their own):
- `w:<series>`      sorted set, score = ts, member = JSON `[ts, gpu_util, mem_used_mib, ...]`;
                    the same sample pushed twice is one member, so an agent's retry adds nothing
- `latest`          hash, series -> JSON of its latest sample with its labels
- `minutes`         sorted set of minutes (epoch seconds) that got samples
- `dirty:<minute>`  set of the series that got samples for that minute since it was downsampled
"""

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from django.conf import settings

# What a window row holds after its ts, in this order.
FIELDS = ("gpu_util", "mem_used_mib", "mem_total_mib", "temperature_c", "power_w", "sm_clock_mhz")
# Samples are kept a minute past the window, so that the minute being downsampled at the edge
# of the window is still whole.
KEEP_EXTRA_SECONDS = 60
TRIM_EVERY_SECONDS = 10.0
# json.dumps(value, separators=(",", ":")) without building an encoder per call (the hot path
# writes a few dozen JSON texts a batch).
compact_json = json.JSONEncoder(separators=(",", ":")).encode


@dataclass(frozen=True, slots=True)
class Point:
    series: str
    ts: float
    values: tuple  # FIELDS order

    def member(self) -> str:
        return compact_json([self.ts, *self.values])


def minute_of(ts: float) -> int:
    return int(ts // 60) * 60


def window_seconds() -> int:
    return settings.METRICS_LIVE_WINDOW_SECONDS


def decode(member: str | bytes) -> list:
    """A window row: `[ts, *FIELDS]`."""
    return json.loads(member)


def as_dict(row: list) -> dict:
    return {"ts": row[0], **dict(zip(FIELDS, row[1:], strict=False))}


class MemoryWindow:
    """The window in this process (no REDIS_URL)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._series: dict[str, dict[str, float]] = {}
        self._latest: dict[str, str] = {}
        self._dirty: dict[int, set[str]] = {}
        self._trimmed: dict[str, float] = {}

    def add(self, points: Iterable[Point], latest: dict[str, dict], now: float, publish=()) -> None:
        if publish:
            raise ValueError("the in-process window publishes nothing: use the channel layer")
        oldest = now - window_seconds() - KEEP_EXTRA_SECONDS
        with self._lock:
            touched = set()
            for point in points:
                members = self._series.setdefault(point.series, {})
                members[point.member()] = point.ts
                self._dirty.setdefault(minute_of(point.ts), set()).add(point.series)
                touched.add(point.series)
            for series, sample in latest.items():
                self._latest[series] = compact_json(sample)
            # As in Redis: a busy series is trimmed now and then, not with every batch.
            for series in touched:
                if now - self._trimmed.get(series, 0.0) < TRIM_EVERY_SECONDS:
                    continue
                self._trimmed[series] = now
                members = self._series[series]
                for member in [m for m, ts in members.items() if ts < oldest]:
                    del members[member]

    def window(self, series: str, since: float = float("-inf"), until: float = float("inf")):
        with self._lock:
            members = dict(self._series.get(series, {}))
        return [
            decode(m)
            for m, ts in sorted(members.items(), key=lambda i: i[1])
            if since <= ts < until
        ]

    def windows(
        self, series: list[str], since: float = float("-inf"), until: float = float("inf")
    ) -> dict[str, list]:
        return {name: self.window(name, since, until) for name in series}

    def latest(self) -> dict[str, dict]:
        with self._lock:
            return {series: json.loads(raw) for series, raw in self._latest.items()}

    def drop_latest(self, series: list[str]) -> None:
        with self._lock:
            for name in series:
                self._latest.pop(name, None)

    def minutes(self) -> list[int]:
        with self._lock:
            return sorted(m for m, names in self._dirty.items() if names)

    def dirty(self, minute: int) -> set[str]:
        with self._lock:
            return set(self._dirty.get(minute, ()))

    def clean(self, minute: int, series: set[str]) -> None:
        with self._lock:
            left = self._dirty.get(minute, set()) - series
            if left:
                self._dirty[minute] = left
            else:
                self._dirty.pop(minute, None)

    def forget_minutes_before(self, minute: int) -> None:
        with self._lock:
            for old in [m for m in self._dirty if m < minute]:
                del self._dirty[old]

    def clear(self) -> None:
        with self._lock:
            self._series.clear()
            self._latest.clear()
            self._dirty.clear()
            self._trimmed.clear()


class RedisWindow:
    """The window in Redis (REDIS_URL): shared by every process."""

    def __init__(self, url: str, prefix: str):
        import redis

        self.redis = redis.Redis.from_url(url)
        self.prefix = prefix
        self._trimmed: dict[str, float] = {}
        self._minutes_noted: dict[int, float] = {}

    def add(
        self,
        points: Iterable[Point],
        latest: dict[str, dict],
        now: float,
        publish: Iterable[tuple[str, bytes]] = (),
    ) -> None:
        """Write the points and latest samples, then PUBLISH `publish` (channel, payload), all in
        one round trip: the samples are in the window before anyone hears of them."""
        keep = window_seconds() + KEEP_EXTRA_SECONDS
        by_series: dict[str, dict[str, float]] = {}
        dirty: dict[int, set[str]] = {}
        for point in points:
            by_series.setdefault(point.series, {})[point.member()] = point.ts
            dirty.setdefault(minute_of(point.ts), set()).add(point.series)
        pipe = self.redis.pipeline(transaction=False)
        for series, members in by_series.items():
            key = self.prefix + "w:" + series
            pipe.zadd(key, members)
            # An idle series goes away by itself; a busy one is trimmed now and then.
            if now - self._trimmed.get(series, 0.0) >= TRIM_EVERY_SECONDS:
                self._trimmed[series] = now
                pipe.zremrangebyscore(key, "-inf", f"({now - keep}")
                pipe.expire(key, keep)
        if latest:
            pipe.hset(
                self.prefix + "latest",
                mapping={s: compact_json(v) for s, v in latest.items()},
            )
        for minute, series in dirty.items():
            pipe.sadd(f"{self.prefix}dirty:{minute}", *series)
        # A minute stays in `minutes` until it leaves the window (forget_minutes_before), so
        # this process notes it, and pushes its dirty set's expiry, every TRIM_EVERY_SECONDS.
        noted = [m for m in dirty if now - self._minutes_noted.get(m, 0.0) >= TRIM_EVERY_SECONDS]
        for minute in noted:
            self._minutes_noted[minute] = now
            pipe.expire(f"{self.prefix}dirty:{minute}", keep + 60)
        if noted:
            pipe.zadd(self.prefix + "minutes", {str(m): m for m in noted})
            for old in [m for m in self._minutes_noted if m < now - keep - 60]:
                del self._minutes_noted[old]
        for channel, payload in publish:
            pipe.publish(channel, payload)
        pipe.execute()

    def window(self, series: str, since: float = float("-inf"), until: float = float("inf")):
        low = "-inf" if since == float("-inf") else since
        high = "+inf" if until == float("inf") else f"({until}"
        return [decode(m) for m in self.redis.zrangebyscore(self.prefix + "w:" + series, low, high)]

    def windows(
        self, series: list[str], since: float = float("-inf"), until: float = float("inf")
    ) -> dict[str, list]:
        """The windows of many series in one round trip."""
        low = "-inf" if since == float("-inf") else since
        high = "+inf" if until == float("inf") else f"({until}"
        pipe = self.redis.pipeline(transaction=False)
        for name in series:
            pipe.zrangebyscore(self.prefix + "w:" + name, low, high)
        return {
            name: [decode(m) for m in members]
            for name, members in zip(series, pipe.execute(), strict=True)
        }

    def latest(self) -> dict[str, dict]:
        return {
            series.decode(): json.loads(raw)
            for series, raw in self.redis.hgetall(self.prefix + "latest").items()
        }

    def drop_latest(self, series: list[str]) -> None:
        if series:
            self.redis.hdel(self.prefix + "latest", *series)

    def minutes(self) -> list[int]:
        return [int(m) for m in self.redis.zrangebyscore(self.prefix + "minutes", "-inf", "+inf")]

    def dirty(self, minute: int) -> set[str]:
        return {s.decode() for s in self.redis.smembers(f"{self.prefix}dirty:{minute}")}

    def clean(self, minute: int, series: set[str]) -> None:
        """Forget the series just downsampled; one that got a sample meanwhile stays dirty."""
        if series:
            self.redis.srem(f"{self.prefix}dirty:{minute}", *series)

    def forget_minutes_before(self, minute: int) -> None:
        old = [
            int(m) for m in self.redis.zrangebyscore(self.prefix + "minutes", "-inf", f"({minute}")
        ]
        if old:
            pipe = self.redis.pipeline(transaction=False)
            pipe.delete(*[f"{self.prefix}dirty:{m}" for m in old])
            pipe.zrem(self.prefix + "minutes", *[str(m) for m in old])
            pipe.execute()

    def clear(self) -> None:
        self._trimmed.clear()
        self._minutes_noted.clear()
        keys = list(self.redis.scan_iter(match=self.prefix + "*", count=1000))
        for start in range(0, len(keys), 500):
            self.redis.delete(*keys[start : start + 500])


_store = None
_store_lock = threading.Lock()


def store() -> MemoryWindow | RedisWindow:
    """The window of this process's configuration (one per process)."""
    global _store
    if _store is None:
        with _store_lock:
            if _store is None:
                url = settings.REDIS_URL
                _store = (
                    RedisWindow(url, f"{settings.DEPLOYMENT_NAME}:metrics:")
                    if url
                    else MemoryWindow()
                )
    return _store


def reset_store() -> None:
    """Forget the configured store (tests that change REDIS_URL)."""
    global _store
    with _store_lock:
        _store = None


def now() -> float:
    return time.time()
