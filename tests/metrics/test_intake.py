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
    latest = {f"gpu:1:{n}": {"ts": now, "gpu_util": n} for n in range(1500)}
    store.add(points, latest, now)
    assert len(store.window("gpu:1:0")) == 2500
    assert len(store.latest()) == 1500
    minutes = store.minutes()
    assert minutes and all(store.dirty(m) == {"gpu:1:0"} for m in minutes)
    store.clear()
    live.reset_store()
