"""The intake thread's groups (console/metrics/intake.py): batches that waited together are
written to the live window in one call, each is answered on its own, and a failed write fails
every batch of its group, with nothing of it published."""

import asyncio
import time

import pytest

from console.metrics import ingest, intake, live
from console.metrics.samples import accept_body, authenticate
from tests.metrics.conftest import alloc_sample, gpu_sample

pytestmark = pytest.mark.django_db(transaction=True)


def body(host, *samples) -> bytes:
    import json

    return json.dumps({"host_id": host.pk, "samples": list(samples)}).encode()


def test_a_group_is_written_in_one_call_and_each_batch_answered(world, window_backend):
    now = time.time()
    host_a, host_b = (
        authenticate("Bearer secret-of-host-a"),
        authenticate("Bearer secret-of-host-b"),
    )
    calls = []
    store = live.store()
    if window_backend == "redis":
        script = store._add

        def counted(*args, **kwargs):
            calls.append(args)
            return script(*args, **kwargs)

        store._add = counted
    first = body(world.host, gpu_sample(now, 0), alloc_sample(now, "alloc-train"))
    group = [
        (accept_body, (host_a, first)),
        (accept_body, (host_a, b"[{")),
        (accept_body, (host_b, body(world.host_b, gpu_sample(now, 1, host="host-b")))),
        (authenticate, ("Bearer nobody",)),
    ]  # fmt: skip
    outcomes = intake.take(group)

    assert outcomes[0] == (True, (202, {"accepted": 2, "ignored": 0}))
    assert outcomes[1][1][0] == 400
    assert outcomes[2] == (True, (202, {"accepted": 1, "ignored": 0}))
    assert outcomes[3][0] is False and outcomes[3][1].status == 401
    # in the memory window each batch writes as it comes; in Redis the group writes once
    assert len(calls) == (1 if window_backend == "redis" else 0)
    assert live.store().window(ingest.gpu_series(world.host.pk, 0))[0][0] == now
    assert live.store().window(ingest.gpu_series(world.host_b.pk, 1))[0][0] == now
    assert live.store().window(ingest.instance_series(world.train.pk))[0][0] == now
    assert set(live.store().latest()) >= {
        ingest.gpu_series(world.host.pk, 0),
        ingest.gpu_series(world.host_b.pk, 1),
        ingest.instance_series(world.train.pk),
    }


def test_a_failed_write_fails_every_batch_of_its_group(world, settings, redis_url):
    settings.REDIS_URL = redis_url
    live.reset_store()
    now = time.time()
    host_a = authenticate("Bearer secret-of-host-a")

    def down(*args, **kwargs):
        raise ConnectionError("Redis went away")

    live.store()._add = down
    outcomes = intake.take(
        [(accept_body, (host_a, body(world.host, gpu_sample(now + n, 0)))) for n in range(3)]
    )
    assert [succeeded for succeeded, _ in outcomes] == [False] * 3
    assert all(isinstance(error, ConnectionError) for _, error in outcomes)
    live.reset_store()


def test_the_intake_answers_each_caller_from_its_thread(world, window_backend):
    now = time.time()

    async def both():
        return await asyncio.gather(
            intake.intake.call(authenticate, "Bearer secret-of-host-a"),
            intake.intake.call(lambda: 1 / 0),
            return_exceptions=True,
        )

    host, error = asyncio.run(both())
    assert host.pk == world.host.pk
    assert isinstance(error, ZeroDivisionError)
    assert live.store().window(ingest.gpu_series(world.host.pk, 0), since=now) == []


def test_redis_takes_a_batch_past_the_scripts_chunks(world, settings, redis_url):
    """One series of 2,500 samples (a backlog) and 1,500 latest series: past the 1,000 the
    script hands a Redis command at once."""
    settings.REDIS_URL = redis_url
    live.reset_store()
    store = live.store()
    now = time.time()
    points = [live.Point("gpu:1:0", now - k * 0.1, (1.5, 2, 3, 4, 5, 6)) for k in range(2500)]
    points += [live.Point(f"gpu:1:{n}", now, (n, 2, 3, 4, 5, 6)) for n in range(1, 1500)]
    latest = {f"gpu:1:{n}": f'{{"gpu":{n}}}' for n in range(1500)}
    store.add(points, latest, now)
    assert len(store.window("gpu:1:0")) == 2500
    found = store.latest()
    assert len(found) == 1500
    assert found["gpu:1:0"] == {"ts": now, **live.as_dict([now, 1.5, 2, 3, 4, 5, 6]), "gpu": 0}
    assert found["gpu:1:1499"]["gpu_util"] == 1499
    minutes = store.minutes()
    assert minutes and set().union(*map(store.dirty, minutes)) == set(latest)
    store.clear()
    live.reset_store()


def test_a_series_latest_sample_is_its_newest_point_with_its_labels(settings, redis_url):
    """Batches that waited together: each series' latest sample is its newest, whatever order
    the batches came in, and carries the labels its batch gave."""
    settings.REDIS_URL = redis_url
    live.reset_store()
    live.store().clear()
    now = time.time()
    with live.writes_together():
        live.store().add(
            [live.Point("gpu:7:0", now, (90.0, 2, 3, 4, 5, 6))],
            {"gpu:7:0": '{"healthy":false}'},
            now,
        )
        live.store().add(
            [live.Point("gpu:7:0", now - 1, (10.0, 2, 3, 4, 5, 6))],
            {"gpu:7:0": '{"healthy":false}'},
            now,
        )
    assert live.store().latest()["gpu:7:0"] == {
        "ts": now, "gpu_util": 90.0, "mem_used_mib": 2, "mem_total_mib": 3, "temperature_c": 4,
        "power_w": 5, "sm_clock_mhz": 6, "healthy": False,
    }  # fmt: skip
    assert [row[1] for row in live.store().window("gpu:7:0")] == [10.0, 90.0]
    live.store().clear()
    live.reset_store()


def test_a_latest_sample_written_whole_by_an_older_console_still_reads():
    """An upgrade: the `latest` entries of the console before are whole JSON objects."""
    assert live.decode_latest(b'{"ts": 5.0, "gpu_util": 1, "kind": "gpu"}') == {
        "ts": 5.0, "gpu_util": 1, "kind": "gpu"
    }  # fmt: skip


def test_the_thread_checks_its_database_connections_once_a_second_and_after_a_failure(
    monkeypatch,
):
    checks = []
    monkeypatch.setattr(intake, "close_old_connections", lambda: checks.append(time.monotonic()))
    monkeypatch.setattr(intake, "GATHER_SECONDS", 0.0)
    own = intake.Intake()

    async def calls(function, count):
        return await asyncio.gather(
            *[own.call(function) for _ in range(count)], return_exceptions=True
        )

    for _ in range(20):
        asyncio.run(calls(lambda: 1, 1))
    assert len(checks) == 1  # twenty groups in well under a second
    asyncio.run(calls(lambda: 1 / 0, 1))
    asyncio.run(calls(lambda: 1, 1))
    assert len(checks) == 2  # the group after a failure checks first
