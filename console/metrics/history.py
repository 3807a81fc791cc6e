"""The history: finished minutes of the live window folded into MetricMinute rows (min, mean,
max), kept settings.METRICS_HISTORY_DAYS days; and the chart data of a time range, from the
window (full rate) or from the rows (1-minute or 10-minute points)."""

import logging
import math
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, transaction

from console.fleet.models import Host
from console.instances.models import Instance
from console.metrics import live
from console.metrics.models import METRICS, MetricMinute

log = logging.getLogger(__name__)

# A minute is folded once it has been over for this long: samples arrive in 1 s pushes. One that
# comes later still (an agent that was cut off for a while) marks its minute again, and the next
# run folds it again from the whole window.
GRACE_SECONDS = 5
RANGES = {"10m": 600, "1h": 3600, "24h": 86400, "7d": 7 * 86400}
# The resolution of a range's points, in seconds (0: every sample, from the live window).
RESOLUTION = {"10m": 0, "1h": 60, "24h": 60, "7d": 600}
VALUE_FIELDS = [
    "samples",
    *[f"{m}_{agg}" for m in METRICS for agg in ("min", "mean", "max")],
    "mem_total_mib",
]
_INDEX = {name: n + 1 for n, name in enumerate(live.FIELDS)}  # column of a window row


def summarise(rows: list[list]) -> dict:
    """min, mean and max of each metric over window rows (`[ts, *live.FIELDS]`), nulls left out;
    the mean is exact (fsum) before it becomes a float column."""
    out: dict = {"samples": len(rows)}
    for metric in METRICS:
        values = [row[_INDEX[metric]] for row in rows if row[_INDEX[metric]] is not None]
        out[f"{metric}_min"] = min(values) if values else None
        out[f"{metric}_mean"] = math.fsum(values) / len(values) if values else None
        out[f"{metric}_max"] = max(values) if values else None
    totals = [
        row[_INDEX["mem_total_mib"]] for row in rows if row[_INDEX["mem_total_mib"]] is not None
    ]
    out["mem_total_mib"] = max(totals) if totals else None
    return out


def series_owner(series: str) -> dict:
    """The columns a series name implies: `instance:12`, `gpu:3:0`, `mig:3:0:MIG-…`."""
    kind, _, rest = series.partition(":")
    if kind == "instance":
        return {"instance_id": int(rest), "host_id": None, "gpu_index": None}
    host, _, rest = rest.partition(":")
    index = rest.partition(":")[0]
    return {"instance_id": None, "host_id": int(host), "gpu_index": int(index)}


def fold_minute(minute: int, series: set[str] | list[str]) -> int:
    """Upsert the rows of `minute` (epoch seconds) for `series` from the live window; answer
    how many. Folding the same minute again from the same samples writes the same rows. A row
    the database refuses is logged and left out; the others are kept."""
    store = live.store()
    names = sorted(series)
    windows = store.windows(names, minute, minute + 60)
    owners = {name: series_owner(name) for name in names if windows[name]}
    instances = set(
        Instance.objects.filter(
            pk__in={o["instance_id"] for o in owners.values() if o["instance_id"]}
        ).values_list("pk", flat=True)
    )
    hosts = set(
        Host.objects.filter(
            pk__in={o["host_id"] for o in owners.values() if o["host_id"]}
        ).values_list("pk", flat=True)
    )
    at = datetime.fromtimestamp(minute, tz=UTC)
    rows = [
        MetricMinute(series=name, minute=at, **owner, **summarise(windows[name]))
        for name, owner in owners.items()
        if (owner["instance_id"] in instances) or (owner["host_id"] in hosts)
    ]
    if not rows:
        return 0
    try:
        with transaction.atomic():
            _upsert(rows)
        return len(rows)
    except DatabaseError as exc:
        log.warning("metrics: minute %s: %s; storing its %d rows one by one", at, exc, len(rows))
    stored = 0
    for row in rows:  # a row the database refuses is left out, not the minute of everyone
        try:
            with transaction.atomic():
                _upsert([row])
            stored += 1
        except DatabaseError as exc:
            log.error("metrics: %s not kept: %s", row, exc)
    return stored


def _upsert(rows: list[MetricMinute]) -> None:
    MetricMinute.objects.bulk_create(
        rows,
        batch_size=500,
        update_conflicts=True,
        unique_fields=["series", "minute"],
        update_fields=["instance", "host", "gpu_index", *VALUE_FIELDS],
    )


def downsample(now: float | None = None) -> dict:
    """Fold every finished minute that got samples since it was last folded; drop history older
    than settings.METRICS_HISTORY_DAYS and latest samples older than the window. Idempotent."""
    now = live.now() if now is None else now
    store = live.store()
    window_start = now - live.window_seconds()
    folded = rows = 0
    for minute in store.minutes():
        if minute + 60 > now - GRACE_SECONDS:
            continue  # not over yet
        if minute < window_start:
            continue  # partly out of the window: folded while it was whole; forgotten below
        dirty = store.dirty(minute)
        if not dirty:
            continue
        rows += fold_minute(minute, dirty)
        store.clean(minute, dirty)
        folded += 1
    store.forget_minutes_before(live.minute_of(window_start))
    stale = [s for s, v in store.latest().items() if v.get("ts", 0) < window_start]
    store.drop_latest(stale)
    cutoff = datetime.fromtimestamp(now, tz=UTC) - timedelta(days=settings.METRICS_HISTORY_DAYS)
    deleted, _ = MetricMinute.objects.filter(minute__lt=cutoff).delete()
    if rows or deleted:
        log.info("metrics: %d minute(s) folded into %d row(s); %d old row(s) deleted",
                 folded, rows, deleted)  # fmt: skip
    return {"minutes": folded, "rows": rows, "deleted": deleted}


# --- chart data -----------------------------------------------------------------------------

CHART_METRICS = ("gpu_util", "mem_used_mib", "temperature_c", "power_w")


def _empty(range_name: str, resolution: int, since: float, until: float) -> dict:
    data = {"range": range_name, "resolution_seconds": resolution, "from": since, "to": until}
    data["ts"] = []
    for metric in CHART_METRICS:
        data[metric] = []
        data[f"{metric}_min"] = []
        data[f"{metric}_max"] = []
    data["mem_total_mib"] = []
    return data


def _add_raw(data: dict, rows: list[list]) -> None:
    for row in rows:
        data["ts"].append(row[0])
        for metric in CHART_METRICS:
            value = row[_INDEX[metric]]
            data[metric].append(value)
            data[f"{metric}_min"].append(value)
            data[f"{metric}_max"].append(value)
        data["mem_total_mib"].append(row[_INDEX["mem_total_mib"]])


def _bucket(rows: list[MetricMinute]) -> dict:
    """Several minute rows as one point: min of mins, sample-weighted mean, max of maxes."""
    point: dict = {}
    for metric in CHART_METRICS:
        mins = [
            getattr(r, f"{metric}_min") for r in rows if getattr(r, f"{metric}_min") is not None
        ]
        maxes = [
            getattr(r, f"{metric}_max") for r in rows if getattr(r, f"{metric}_max") is not None
        ]
        weighted = [
            (getattr(r, f"{metric}_mean"), r.samples)
            for r in rows
            if getattr(r, f"{metric}_mean") is not None
        ]
        weight = sum(n for _, n in weighted)
        point[metric] = math.fsum(v * n for v, n in weighted) / weight if weight else None
        point[f"{metric}_min"] = min(mins) if mins else None
        point[f"{metric}_max"] = max(maxes) if maxes else None
    totals = [r.mem_total_mib for r in rows if r.mem_total_mib is not None]
    point["mem_total_mib"] = max(totals) if totals else None
    return point


def chart_data(series: str, range_name: str, now: float | None = None) -> dict:
    """Columns for Plotly: `ts` (epoch seconds) and each metric's mean, min and max. The short
    range is every sample of the live window; longer ones are history rows (1 or 10 minutes a
    point) followed by the window's samples of the minutes not folded yet."""
    now = live.now() if now is None else now
    seconds = RANGES[range_name]
    resolution = RESOLUTION[range_name]
    since = now - seconds
    data = _empty(range_name, resolution, since, now)
    store = live.store()
    if resolution == 0:
        _add_raw(data, store.window(series, since))
        return data
    rows = list(
        MetricMinute.objects.filter(
            series=series, minute__gte=datetime.fromtimestamp(since, tz=UTC)
        ).order_by("minute")
    )
    buckets: dict[int, list[MetricMinute]] = {}
    for row in rows:
        start = int(row.minute.timestamp())
        buckets.setdefault(start - start % resolution, []).append(row)
    for start, members in buckets.items():
        point = _bucket(members)
        data["ts"].append(start + resolution / 2)
        for key, value in point.items():
            data[key].append(value)
    tail_since = (int(rows[-1].minute.timestamp()) + 60) if rows else since
    _add_raw(data, store.window(series, max(since, tail_since)))
    return data
