"""The live window: every series' samples of the last settings.METRICS_LIVE_WINDOW_SECONDS at full
rate, the latest sample of each series (what /metrics exposes), and the minutes that still need
downsampling into the history.

With REDIS_URL it lives in Redis, shared by every ASGI server and Celery worker. Without it (the
single-process case: unit tests, `manage.py` one-offs) it lives in this process.

Redis keys (prefix `<settings.DEPLOYMENT_NAME>:metrics:`, so that deployments sharing a Redis keep
windows of their own):
- `w:<series>`      sorted set, score = ts, member = JSON `[ts, gpu_util, mem_used_mib, ...]`;
                    the same sample pushed twice is one member, so an agent's retry adds nothing
- `latest`          hash, series -> JSON `[ts, gpu_util, ..., {labels}]`: its latest sample, its
                    window row with the series' labels after the values
- `minutes`         sorted set of minutes (epoch seconds) that got samples
- `dirty:<minute>`  set of the series that got samples for that minute since it was downsampled
"""

import json
import threading
import time
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass

import orjson
from django.conf import settings

# What a window row holds after its ts, in this order.
FIELDS = ("gpu_util", "mem_used_mib", "mem_total_mib", "temperature_c", "power_w", "sm_clock_mhz")
# Samples are kept a minute past the window, so that the minute being downsampled at the edge
# of the window is still whole.
KEEP_EXTRA_SECONDS = 60
TRIM_EVERY_SECONDS = 10.0


def compact_json(value) -> str:
    """json.dumps(value, separators=(",", ":")) for what the hot path writes (a few dozen texts
    a batch: checked samples, finite numbers), in a quarter of the time."""
    return orjson.dumps(value).decode()


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


def latest_row(member: str, labels: str) -> str:
    """A `latest` entry: the sample's window row (`[ts, ...]`) with the series' labels (a JSON
    object) as its last item. Both are already JSON: the hot path joins them, nothing more."""
    return f"{member[:-1]},{labels}]"


def decode_latest(raw: str | bytes) -> dict:
    """A `latest` entry as one dict: ts, the readings, the labels."""
    row = orjson.loads(raw)
    if isinstance(row, dict):  # written whole, by a console of before 2026-12-03
        return row
    return {**as_dict(row[:-1]), **row[-1]}


def _newest(points: Iterable[Point]) -> tuple[dict[str, list[str]], dict[str, tuple[float, str]]]:
    """The points' window rows by series ([score, member, ...]), and each series' newest
    (ts, member)."""
    rows: dict[str, list[str]] = {}
    newest: dict[str, tuple[float, str]] = {}
    for point in points:
        member = point.member()
        rows.setdefault(point.series, []).extend((repr(point.ts), member))
        known = newest.get(point.series)
        if known is None or point.ts >= known[0]:
            newest[point.series] = (point.ts, member)
    return rows, newest


class MemoryWindow:
    """The window in this process (no REDIS_URL)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._series: dict[str, dict[str, float]] = {}
        self._latest: dict[str, str] = {}
        self._dirty: dict[int, set[str]] = {}
        self._trimmed: dict[str, float] = {}

    def add(self, points: Iterable[Point], latest: dict[str, str], now: float, publish=()) -> None:
        """As RedisWindow.add."""
        if publish:
            raise ValueError("the in-process window publishes nothing: use the channel layer")
        oldest = now - window_seconds() - KEEP_EXTRA_SECONDS
        points = list(points)
        rows, newest = _newest(points)
        with self._lock:
            for point in points:
                self._dirty.setdefault(minute_of(point.ts), set()).add(point.series)
            for series, items in rows.items():  # [score, member, ...]
                members = self._series.setdefault(series, {})
                members.update(zip(items[1::2], map(float, items[::2]), strict=True))
            for series, labels in latest.items():
                if series in newest:
                    self._latest[series] = latest_row(newest[series][1], labels)
            # As in Redis: a busy series is trimmed now and then, not with every batch.
            for series in rows:
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
            return {series: decode_latest(raw) for series, raw in self._latest.items()}

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


# RedisWindow.add's writes, in one command: each redis-py command of a pipeline cost ~15 µs of
# the web process's CPU, and a batch of 8 GPUs' samples was ~30 of them; an argument each
# value, ~1 µs each (bench/metrics.py). KEYS: the `latest` hash, the `minutes` sorted set.
# ARGV[1]: JSON [trim bound, window lifetime, dirty set lifetime, windows: [[key, trim?,
# [score, member, ...]], ...], latest: [series, JSON, ...], dirty sets: [[key, minute, note?,
# [series, ...]], ...]], every number that Redis stores written as a string (Lua would write a
# float with 14 digits); then (channel, payload) pairs to PUBLISH.
ADD_SCRIPT = """
local function call(command, key, items)
  for first = 1, #items, 1000 do
    redis.call(command, key, unpack(items, first, math.min(first + 999, #items)))
  end
end
local add = cjson.decode(ARGV[1])
local bound, window_keep, dirty_keep = add[1], add[2], add[3]
for _, window in ipairs(add[4]) do
  call('ZADD', window[1], window[3])
  if window[2] then
    redis.call('ZREMRANGEBYSCORE', window[1], '-inf', bound)
    redis.call('EXPIRE', window[1], window_keep)
  end
end
call('HSET', KEYS[1], add[5])
for _, dirty in ipairs(add[6]) do
  call('SADD', dirty[1], dirty[4])
  if dirty[3] then
    redis.call('EXPIRE', dirty[1], dirty_keep)
    redis.call('ZADD', KEYS[2], dirty[2], dirty[2])
  end
end
for i = 2, #ARGV, 2 do
  redis.call('PUBLISH', ARGV[i], ARGV[i + 1])
end
"""


class RedisWindow:
    """The window in Redis (REDIS_URL): shared by every process."""

    def __init__(self, url: str, prefix: str):
        import redis

        self.redis = redis.Redis.from_url(url)
        self.prefix = prefix
        self._add = self.redis.register_script(ADD_SCRIPT)
        self._trimmed: dict[str, float] = {}
        self._minutes_noted: dict[int, float] = {}

    def add(
        self,
        points: Iterable[Point],
        latest: dict[str, str],
        now: float,
        publish: Iterable[tuple[str, bytes]] = (),
    ) -> None:
        """Write the points and the latest samples, then PUBLISH `publish` (channel, payload), all
        in one call of ADD_SCRIPT: the samples are in the window before anyone hears of them.
        `latest` gives series -> its labels (a JSON object): the series' newest point becomes
        its latest sample, with them. Within writes_together, the call is kept for the one at
        its end."""
        group = getattr(_together, "group", None)
        if group is not None:
            group.append((points, latest, now, publish))
            return
        keep = window_seconds() + KEEP_EXTRA_SECONDS
        points = list(points)
        by_series, newest = _newest(points)
        dirty: dict[int, set[str]] = {}
        for point in points:
            dirty.setdefault(minute_of(point.ts), set()).add(point.series)
        windows = []
        for series, members in by_series.items():
            # An idle series goes away by itself; a busy one is trimmed now and then.
            trim = now - self._trimmed.get(series, 0.0) >= TRIM_EVERY_SECONDS
            if trim:
                self._trimmed[series] = now
            windows.append((self.prefix + "w:" + series, trim, members))
        # A minute stays in `minutes` until it leaves the window (forget_minutes_before), so
        # this process notes it, and pushes its dirty set's expiry, every TRIM_EVERY_SECONDS.
        dirty_sets = []
        for minute, series in dirty.items():
            noted = now - self._minutes_noted.get(minute, 0.0) >= TRIM_EVERY_SECONDS
            if noted:
                self._minutes_noted[minute] = now
            dirty_sets.append((f"{self.prefix}dirty:{minute}", str(minute), noted, list(series)))
        for old in [m for m in self._minutes_noted if m < now - keep - 60]:
            del self._minutes_noted[old]
        add = (
            f"({now - keep!r}",
            keep,
            keep + 60,
            windows,
            [
                item
                for series, labels in latest.items()
                if series in newest
                for item in (series, latest_row(newest[series][1], labels))
            ],
            dirty_sets,
        )
        args = [orjson.dumps(add)]
        for channel, payload in publish:
            args += (channel, payload)
        self._add(keys=[self.prefix + "latest", self.prefix + "minutes"], args=args)

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
            series.decode(): decode_latest(raw)
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
_together = threading.local()


@contextmanager
def writes_together():
    """This thread's RedisWindow.add calls within it made as one at its end (console.metrics.
    intake): the points of all, each series' newest point as its latest sample (with the
    labels the last call gave it), then the publishes of all, in order. Nothing is written
    when the block raises."""
    if getattr(_together, "group", None) is not None:
        raise RuntimeError("writes_together does not nest")
    group = _together.group = []
    try:
        yield
    finally:
        _together.group = None
    if not group:
        return
    points, latest, publish = [], {}, []
    for added in group:
        points += added[0]
        latest.update(added[1])
        publish += added[3]
    store().add(points, latest, max(added[2] for added in group), publish)


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
