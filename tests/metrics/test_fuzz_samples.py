"""Keep it found (issue 12): random and hostile sample batches posted to /agent/v1/samples never
get a 5xx, and nothing they leave behind breaks a later job: the downsampler, /metrics, the
metrics API and the websockets' window all still work and speak strict JSON."""

import json
import math
import time

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from accounts.roles import Role
from console.fleet.models import Gpu
from console.metrics import history, live
from console.metrics.models import MetricMinute

pytestmark = pytest.mark.slow  # property-based: many examples

MIG = "MIG-host-a-0-0"
NOW = time.time()

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=0, max_value=200),
    st.floats(min_value=0, max_value=100),
)
timestamps = st.one_of(
    st.floats(min_value=NOW - 900, max_value=NOW + 400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**400), max_value=10**400),
)
FIELDS = {
    "ts": timestamps,
    "kind": st.one_of(st.sampled_from(["gpu", "mig", "allocation", "GPU", ""]), junk),
    "gpu_index": st.one_of(st.integers(min_value=-3, max_value=3), st.integers(), junk),
    "gpu_uuid": st.one_of(
        st.sampled_from(["GPU-host-a-0", "GPU-host-a-1", "GPU-host-b-0", "GPU-" + "x" * 100]),
        junk,
    ),
    "mig_uuid": st.one_of(st.sampled_from([MIG, "MIG-other"]), st.text(max_size=90), junk),
    "allocation": st.one_of(st.sampled_from(["alloc-train", "alloc-infer", "alloc-big"]), junk),
    "gpu_util": st.one_of(numbers, junk),
    "mem_used_mib": st.one_of(numbers, junk),
    "mem_total_mib": st.one_of(numbers, junk),
    "temperature_c": st.one_of(numbers, junk),
    "power_w": st.one_of(numbers, junk),
    "sm_clock_mhz": st.one_of(numbers, junk),
    "ecc_errors": st.one_of(numbers, junk),
    "healthy": st.one_of(st.booleans(), junk),
    "processes": st.one_of(
        st.lists(st.fixed_dictionaries({"pid": st.integers(), "used_mib": numbers}), max_size=3),
        junk,
    ),
}


@st.composite
def sample(draw):
    """A sample: every field plausible or hostile, some left out."""
    keep = draw(st.sets(st.sampled_from(sorted(FIELDS)), min_size=len(FIELDS) - 2))
    return {name: draw(FIELDS[name]) for name in sorted(keep)}


@st.composite
def valid_sample(draw):
    """A sample the door takes, so that the jobs after it get data to chew on."""
    kind = draw(st.sampled_from(["gpu", "mig", "allocation"]))
    reading = st.one_of(st.none(), st.floats(min_value=0, max_value=100))
    return {
        "ts": time.time() + draw(st.floats(min_value=-700, max_value=250)),
        "kind": kind,
        "gpu_index": draw(st.sampled_from([0, 1, 7])),
        "gpu_uuid": draw(st.sampled_from([None, "GPU-host-a-0", "GPU-host-a-1"])),
        "mig_uuid": draw(st.sampled_from([None, MIG, "MIG-invented"])),
        "allocation": draw(st.sampled_from([None, "alloc-train", "alloc-infer", "alloc-big"])),
        "gpu_util": draw(reading),
        "mem_used_mib": draw(st.one_of(st.none(), st.integers(0, 81920))),
        "mem_total_mib": draw(st.one_of(st.none(), st.integers(0, 81920))),
        "temperature_c": draw(reading),
        "power_w": draw(reading),
        "sm_clock_mhz": draw(st.one_of(st.none(), st.integers(0, 2000))),
        "ecc_errors": draw(st.one_of(st.none(), st.integers(0, 10))),
        "healthy": True,
        "processes": [],
    }


NUMBER_FIELDS = [
    "ts", "gpu_index", "gpu_util", "mem_used_mib", "mem_total_mib", "temperature_c", "power_w",
    "sm_clock_mhz", "ecc_errors",
]  # fmt: skip
hostile_numbers = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1, -1.5, 10**6, 10**30, 1e300, -(10**20)]),
    st.integers(min_value=-(10**400), max_value=10**400),
)


@st.composite
def tampered_sample(draw):
    """A sample the door takes, but for one number: out of range, NaN or infinite."""
    tampered = draw(valid_sample())
    field = draw(st.sampled_from(NUMBER_FIELDS))
    tampered[field] = draw(hostile_numbers)
    return tampered


# This host's batches: good samples with a tampered one among them, or hostile of every kind.
batches = st.one_of(
    st.tuples(st.lists(valid_sample(), max_size=8), tampered_sample()).map(lambda t: [*t[0], t[1]]),
    st.lists(st.one_of(valid_sample(), tampered_sample(), sample(), junk), max_size=12),
    st.lists(valid_sample(), max_size=12),
    junk,
)
# Bodies of another shape, and batches that another host's id or no number at all heads.
raw_bodies = st.one_of(
    st.sampled_from(["[" * 50_000, '{"samples": ' + "[" * 50_000, "", "{", "NaN", '"x"']),
    st.binary(max_size=40),
    st.tuples(st.sampled_from(["other", None, "1", True, 10**40, 1.5]), batches),
)


def strict(text):
    def refuse(constant):
        raise AssertionError(f"{constant} in strict JSON")

    return json.loads(text, parse_constant=refuse)


def finite_or_none(value) -> bool:
    return value is None or (isinstance(value, int | float) and math.isfinite(value))


@pytest.fixture
def stage(world, settings, token_client):
    Gpu.objects.filter(host=world.host, index=0).update(
        mig_devices=[{"uuid": MIG, "profile": "3g.40gb", "start": 4, "size": 4}]
    )
    settings.METRICS_ALLOWED_IPS = ["127.0.0.1"]
    world.agent = Client(headers={"Authorization": "Bearer secret-of-host-a"})
    assert world.alice.role == Role.VIEWER  # the least a tenant's member may be
    world.api = token_client(world.alice)
    return world


def check_everything_downstream(world):
    now = time.time()
    for when in (now, now + 400):  # minutes over now, and those ahead of the clock
        history.downsample(now=when)
    for row in MetricMinute.objects.values():
        assert all(
            finite_or_none(v) for k, v in row.items() if k.endswith(("_min", "_mean", "_max"))
        )
    metrics = Client().get("/metrics")
    assert metrics.status_code == 200
    list(text_string_to_metric_families(metrics.content.decode()))
    assert len(metrics.content) < 100_000
    for instance in (world.train,):
        for name in history.RANGES:
            response = world.api.get(f"/api/v1/instances/{instance.pk}/metrics/?range={name}")
            assert response.status_code == 200, response.content
            strict(response.content)
    for series in live.store().latest():
        rows = live.store().window(series)
        strict(json.dumps(rows))  # what the websockets send on connect
        assert all(finite_or_none(v) for row in rows for v in row)


FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def post(world, body):
    response = world.agent.post("/agent/v1/samples", data=body, content_type="application/json")
    assert response.status_code < 500, response.content
    answer = strict(response.content)
    assert response.status_code in (202, 400, 403), answer
    if response.status_code != 202:
        assert {"code", "detail"} <= set(answer)
    return response


@FUZZ
@given(samples=batches)
def test_hostile_batches_get_no_5xx_and_leave_nothing_that_breaks_a_later_job(stage, samples):
    post(stage, json.dumps({"host_id": stage.host.pk, "samples": samples}, allow_nan=True))
    check_everything_downstream(stage)


@FUZZ
@given(body=raw_bodies)
def test_hostile_bodies_get_a_4xx_json_error(stage, body):
    if isinstance(body, tuple):
        host_id, samples = body
        host_id = stage.host_b.pk if host_id == "other" else host_id
        body = json.dumps({"host_id": host_id, "samples": samples}, allow_nan=True)
    assert post(stage, body).status_code in (400, 403)
    check_everything_downstream(stage)
