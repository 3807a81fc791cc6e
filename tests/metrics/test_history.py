"""The downsampler: exact min/mean/max per minute, idempotent, retention; and chart data."""

import time
from datetime import UTC, datetime, timedelta

import pytest

from console.metrics import history, ingest, live
from console.metrics.models import MetricMinute
from tests.metrics.conftest import alloc_sample, gpu_sample

pytestmark = pytest.mark.usefixtures("window_backend")

# A whole minute: 12:00:00 UTC of a fixed day.
MINUTE = int(datetime(2026, 3, 2, 12, 0, tzinfo=UTC).timestamp())


def rows():
    return list(MetricMinute.objects.order_by("series", "minute").values())


def push(host, samples, now):
    """Ingest as if it were `now` (the window keeps what is recent then)."""
    original = live.now
    live.now = lambda: now
    try:
        return ingest.ingest_samples(host, samples)
    finally:
        live.now = original


def test_a_minute_folds_into_exact_min_mean_max(world):
    utils = [10.0, 20.0, 30.0, 45.5]  # mean 26.375, exact in binary
    temps = [61.0, 60.0, None, 63.0]  # a missing reading is left out, not counted as 0
    samples = [
        gpu_sample(MINUTE + 5 + 15 * n, 0, util=u, temperature_c=t, mem_used_mib=1000 * (n + 1))
        for n, (u, t) in enumerate(zip(utils, temps, strict=True))
    ]
    samples.append(gpu_sample(MINUTE + 61, 0, util=99.0))  # the next minute: not in this row
    push(world.host, samples, now=MINUTE + 62)

    assert history.downsample(now=MINUTE + 60 + history.GRACE_SECONDS) == {
        "minutes": 1,
        "rows": 1,
        "deleted": 0,
    }
    row = MetricMinute.objects.get()
    assert row.series == f"gpu:{world.host.pk}:0"
    assert (row.host_id, row.gpu_index, row.instance_id) == (world.host.pk, 0, None)
    assert row.minute == datetime.fromtimestamp(MINUTE, tz=UTC)
    assert row.samples == 4
    assert (row.gpu_util_min, row.gpu_util_mean, row.gpu_util_max) == (10.0, 26.375, 45.5)
    assert (row.temperature_c_min, row.temperature_c_mean, row.temperature_c_max) == (
        60.0,
        (61.0 + 60.0 + 63.0) / 3,
        63.0,
    )
    assert (row.mem_used_mib_min, row.mem_used_mib_mean, row.mem_used_mib_max) == (
        1000,
        2500,
        4000,
    )
    assert row.mem_total_mib == 81920
    assert (row.power_w_min, row.power_w_mean, row.power_w_max) == (200.0, 200.0, 200.0)


def test_instances_get_their_own_series(world):
    push(
        world.host,
        [alloc_sample(MINUTE + 1, "alloc-train", util=40.0),
         alloc_sample(MINUTE + 2, "alloc-train", util=60.0),
         alloc_sample(MINUTE + 1, "alloc-infer", util=90.0)],
        now=MINUTE + 3,
    )  # fmt: skip
    history.downsample(now=MINUTE + 70)
    by_series = {r.series: r for r in MetricMinute.objects.all()}
    train, infer = by_series[f"instance:{world.train.pk}"], by_series[f"instance:{world.infer.pk}"]
    assert (train.instance_id, train.samples, train.gpu_util_mean) == (world.train.pk, 2, 50.0)
    assert (infer.instance_id, infer.samples, infer.gpu_util_mean) == (world.infer.pk, 1, 90.0)


def test_running_twice_changes_nothing(world):
    push(world.host, [gpu_sample(MINUTE + s, 0, util=s) for s in range(0, 60, 7)], MINUTE + 59)
    history.downsample(now=MINUTE + 70)
    first = rows()
    assert len(first) == 1

    assert history.downsample(now=MINUTE + 70)["rows"] == 0  # nothing left to fold
    assert rows() == first
    # Forced to fold the same minute again from the same samples: the same row, same pk.
    history.fold_minute(MINUTE, {f"gpu:{world.host.pk}:0"})
    history.fold_minute(MINUTE, {f"gpu:{world.host.pk}:0"})
    assert rows() == first


def test_the_same_batch_twice_counts_once(world):
    batch = [gpu_sample(MINUTE + 1, 0, util=10.0), gpu_sample(MINUTE + 2, 0, util=20.0)]
    push(world.host, batch, MINUTE + 3)
    push(world.host, batch, MINUTE + 4)  # an agent's retry of a batch it thought lost
    history.downsample(now=MINUTE + 70)
    assert MetricMinute.objects.get().samples == 2


def test_a_late_sample_folds_its_minute_again(world):
    push(world.host, [gpu_sample(MINUTE + 10, 0, util=10.0)], MINUTE + 11)
    history.downsample(now=MINUTE + 70)
    assert MetricMinute.objects.get().gpu_util_max == 10.0

    push(world.host, [gpu_sample(MINUTE + 50, 0, util=30.0)], MINUTE + 90)  # an agent's backlog
    history.downsample(now=MINUTE + 130)
    row = MetricMinute.objects.get()
    assert (row.samples, row.gpu_util_mean, row.gpu_util_max) == (2, 20.0, 30.0)


def test_a_minute_is_not_folded_before_it_is_over(world):
    push(world.host, [gpu_sample(MINUTE + 10, 0)], MINUTE + 11)
    assert history.downsample(now=MINUTE + 60)["rows"] == 0  # within the grace period
    assert history.downsample(now=MINUTE + 60 + history.GRACE_SECONDS)["rows"] == 1


def test_samples_older_than_the_window_are_not_kept(world, settings):
    now = MINUTE + 3600
    result = push(world.host, [gpu_sample(now - settings.METRICS_LIVE_WINDOW_SECONDS - 1, 0)], now)
    assert (result.points, result.too_old) == (0, 1)


def test_history_older_than_the_retention_is_deleted(world, settings):
    now = datetime.fromtimestamp(MINUTE, tz=UTC)
    keep_days = settings.METRICS_HISTORY_DAYS

    def row(age):
        return MetricMinute(
            series=f"gpu:{world.host.pk}:0",
            minute=now - age,
            host=world.host,
            gpu_index=0,
            samples=1,
        )

    MetricMinute.objects.bulk_create(
        [
            row(timedelta(days=keep_days, minutes=1)),
            row(timedelta(days=keep_days + 3)),
            row(timedelta(days=keep_days) - timedelta(minutes=1)),
            row(timedelta(hours=1)),
        ]
    )
    assert history.downsample(now=MINUTE)["deleted"] == 2
    left = sorted(r.minute for r in MetricMinute.objects.all())
    assert left == [
        now - timedelta(days=keep_days) + timedelta(minutes=1),
        now - timedelta(hours=1),
    ]
    assert history.downsample(now=MINUTE)["deleted"] == 0


def test_rows_of_an_instance_that_is_gone_are_not_written(world):
    gone = world.train.pk + 1000
    point = live.Point(f"instance:{gone}", MINUTE + 1, (1.0, 1, 2, 3.0, 4.0, 5))
    live.store().add([point], {}, MINUTE + 2)
    assert history.downsample(now=MINUTE + 70)["rows"] == 0
    assert not MetricMinute.objects.exists()


def test_chart_data_of_the_live_window_is_every_sample(world):
    now = MINUTE + 300
    push(world.host, [alloc_sample(now - 20 + n, "alloc-train", util=n) for n in range(5)], now)
    data = history.chart_data(f"instance:{world.train.pk}", "10m", now=now)
    assert data["resolution_seconds"] == 0
    assert data["ts"] == [now - 20 + n for n in range(5)]
    assert data["gpu_util"] == [0, 1, 2, 3, 4]
    assert data["mem_total_mib"] == [20480] * 5


def test_chart_data_of_an_hour_is_minutes_then_the_unfolded_tail(world):
    now = MINUTE + 600
    series = f"instance:{world.train.pk}"
    for back in (3, 2):  # two folded minutes
        MetricMinute.objects.create(
            series=series, minute=datetime.fromtimestamp(now - back * 60, tz=UTC),
            instance=world.train, samples=60, gpu_util_min=1, gpu_util_mean=back * 10,
            gpu_util_max=99,
        )  # fmt: skip
    push(world.host, [alloc_sample(now - 30, "alloc-train", util=77.0)], now)  # not folded yet
    data = history.chart_data(series, "1h", now=now)
    assert data["resolution_seconds"] == 60
    assert data["gpu_util"] == [30, 20, 77.0]
    assert data["gpu_util_min"] == [1, 1, 77.0]
    assert data["ts"] == [now - 180 + 30, now - 120 + 30, now - 30]


def test_chart_data_of_a_week_is_ten_minute_points(world):
    now = MINUTE
    series = f"instance:{world.train.pk}"
    start = now - 3600 - (now % 600)
    MetricMinute.objects.bulk_create(
        MetricMinute(
            series=series, minute=datetime.fromtimestamp(start + 60 * n, tz=UTC),
            instance=world.train, samples=1 + n % 2, gpu_util_min=n, gpu_util_mean=n,
            gpu_util_max=n,
        )
        for n in range(10)
    )  # fmt: skip
    data = history.chart_data(series, "7d", now=now)
    assert data["resolution_seconds"] == 600
    assert len(data["ts"]) == 1
    weights = [1 + n % 2 for n in range(10)]
    assert data["gpu_util"] == [pytest.approx(sum(n * w for n, w in enumerate(weights)) / 15)]
    assert (data["gpu_util_min"], data["gpu_util_max"]) == ([0], [9])


def test_the_periodic_task_is_the_downsampler(world, settings):
    from console.celery import app
    from console.metrics import tasks

    assert settings.CELERY_BEAT_SCHEDULE["metrics-downsample"]["task"] == tasks.downsample.name
    route = app.amqp.router.route({}, tasks.downsample.name, (), {}, task_type=tasks.downsample)
    assert route["queue"].name == "metrics"
    push(world.host, [gpu_sample(time.time() - 120, 0, util=5.0)], time.time())
    assert tasks.downsample.apply().get()["rows"] == 1
