"""What the samples endpoint refuses, and how: every malformed or hostile batch gets a 4xx with
{"code", "detail"} (never a 500), nothing of it is kept, and nobody's body is read before their
secret is checked."""

import asyncio
import json
import time

import pytest
from django.test import Client

from console.metrics import history, live, samples
from console.metrics.asgi import with_samples_route
from console.metrics.models import MetricMinute
from tests.fleet.conftest import agent_client_for, post_json

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def empty_window():
    live.reset_store()
    live.store().clear()
    yield
    live.store().clear()


def good(gpu, **changes):
    sample = {
        "ts": time.time(), "kind": "gpu", "gpu_index": gpu.index, "gpu_uuid": gpu.uuid,
        "mig_uuid": None, "allocation": None, "gpu_util": 12.5, "mem_used_mib": 100,
        "mem_total_mib": 81920, "temperature_c": 41.0, "power_w": 80.2, "sm_clock_mhz": 1410,
        "ecc_errors": 0, "healthy": True, "processes": [],
    }  # fmt: skip
    return {**sample, **changes}


def post_raw(secret, body: bytes | str):
    return agent_client_for(secret).post(
        "/agent/v1/samples", data=body, content_type="application/json"
    )


def assert_refused(response, status=400, code="invalid"):
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    assert response.json()["code"] == code


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpu_index", -1),
        ("gpu_index", 5000),
        ("gpu_util", 101.0),
        ("gpu_util", -0.5),
        ("mem_used_mib", -1),
        ("mem_total_mib", 10**12),
        ("temperature_c", 1e6),
        ("power_w", -3.0),
        ("sm_clock_mhz", 10**9),
        ("ecc_errors", -1),
        ("gpu_uuid", "GPU-" + "x" * 200),
        ("mig_uuid", "MIG-" + "x" * 200),
        ("allocation", "a" * 65),
        ("processes", [{"pid": n, "used_mib": 1} for n in range(2000)]),
    ],
)
def test_out_of_range_readings_are_refused_at_the_door(register, field, value):
    """Finding 1: a negative gpu_index was accepted (202) and then broke every downsampling run."""
    host, secret = register()
    gpu = host.gpus.get(index=0)
    response = post_json(
        agent_client_for(secret), "/agent/v1/samples",
        {"host_id": host.pk, "samples": [good(gpu), good(gpu, **{field: value})]},
    )  # fmt: skip
    assert_refused(response)
    assert f"samples[1].{field}" in response.json()["detail"]
    assert live.store().latest() == {}  # nothing of a refused batch is kept


@pytest.mark.parametrize("ts", [0, 1.0, -5, 10**12, 10**400, "now"])
def test_a_ts_far_from_now_is_refused(register, ts):
    host, secret = register()
    gpu = host.gpus.get(index=0)
    now = time.time()
    body = {"host_id": host.pk, "samples": [good(gpu, ts=now if ts == "now" else ts)]}
    if ts == "now":
        assert post_json(agent_client_for(secret), "/agent/v1/samples", body).status_code == 202
        for ok in (now - 3600, now + 60):  # an agent's backlog; a clock a minute fast
            body["samples"][0]["ts"] = ok
            assert post_json(agent_client_for(secret), "/agent/v1/samples", body).status_code == 202
        return
    # an integer past 64 bits is not even read as JSON
    code = "parse_error" if ts == 10**400 else "invalid"
    assert_refused(post_json(agent_client_for(secret), "/agent/v1/samples", body), code=code)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
@pytest.mark.parametrize("field", ["gpu_util", "temperature_c", "power_w", "mem_used_mib", "ts"])
def test_non_finite_numbers_are_refused(register, field, literal):
    """Findings 2 and 3: NaN and Infinity (which json.loads takes) were stored, and then the
    tenant's metrics API answered 500; in `ts` they made the endpoint itself answer 500."""
    host, secret = register()
    gpu = host.gpus.get(index=0)
    sample = json.dumps(good(gpu)).replace(f'"{field}": ', f'"{field}": {literal}, "_was": ', 1)
    response = post_raw(secret, f'{{"host_id": {host.pk}, "samples": [{sample}]}}')
    assert response.status_code == 400, response.content
    assert response.json()["code"] in ("parse_error", "invalid")
    assert live.store().latest() == {}


@pytest.mark.parametrize(
    "body",
    [
        "[" * 100_000,
        "{" * 100_000,
        '{"host_id": 1, "samples": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"host_id": 1, "samples": [{"ts": ' + "9" * 400 + "}]}",
        '{"host_id": 1, "samples": [{"ts": ' + "9" * 5000 + "}]}",
        '{"host_id": ' + "9" * 5000 + "}",
        b'{"host_id": 1, "samples": ["\xff\xfe"]}',
        "",
    ],
)
def test_malformed_bodies_are_a_400_json_error_never_a_500(register, body):
    """Finding 3: 100,000 nested `[` (RecursionError) and a huge integer `ts` answered 500."""
    host, secret = register()
    if isinstance(body, str):
        body = body.replace('"host_id": 1,', f'"host_id": {host.pk},')
    response = post_raw(secret, body)
    assert response.status_code == 400, response.content
    assert {"code", "detail"} <= set(response.json())


def test_a_refused_sample_can_no_longer_stop_the_history_of_everyone(register):
    """Finding 1 end to end: after a hostile host's tries, the downsampler folds the good
    host's minute."""
    host, secret = register("good-host")
    bad, bad_secret = register("bad-host")
    now = time.time()
    minute = live.minute_of(now)
    for field, value in (("gpu_index", -1), ("gpu_index", 40000), ("gpu_util", 1e300)):
        body = {"host_id": bad.pk, "samples": [good(bad.gpus.first(), **{field: value})]}
        assert post_json(agent_client_for(bad_secret), "/agent/v1/samples", body).status_code == 400
    body = {"host_id": host.pk, "samples": [good(host.gpus.get(index=0), ts=minute + 1)]}
    assert post_json(agent_client_for(secret), "/agent/v1/samples", body).status_code == 202
    history.downsample(now=minute + 60 + history.GRACE_SECONDS)
    assert list(MetricMinute.objects.values_list("series", flat=True)) == [f"gpu:{host.pk}:0"]


# --- finding 4: the secret before the body ------------------------------------------------


def call_asgi(headers: dict[bytes, bytes], chunks: list[bytes]):
    """POST /agent/v1/samples to the ASGI route; answer (status, JSON answer, chunks read)."""
    read = []
    sent = []

    async def receive():
        if len(read) < len(chunks):
            read.append(chunks[len(read)])
            return {"type": "http.request", "body": read[-1], "more_body": len(read) < len(chunks)}
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    async def django_app(scope, receive, send):
        raise AssertionError("the samples route answers itself")

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/agent/v1/samples",
        "headers": list(headers.items()),
    }
    asyncio.run(with_samples_route(django_app)(scope, receive, send))
    if not sent:
        return None, None, len(read)
    status = sent[0]["status"]
    return status, json.loads(sent[1]["body"]), len(read)


@pytest.mark.django_db(transaction=True)
def test_no_body_is_read_before_the_secret_is_checked(register):
    host, secret = register()
    huge = [b"x" * (1024 * 1024)] * 20  # 20 MB, never to be read
    for authorization in (b"", b"Bearer wrong-secret", b"Basic abc"):
        status, answer, read = call_asgi({b"authorization": authorization}, huge)
        assert (status, read) == (401, 0)
        assert answer["code"] in ("not_authenticated", "invalid_secret")


@pytest.mark.django_db(transaction=True)
def test_an_oversized_body_is_refused_without_buffering_it(register):
    host, secret = register()
    auth = {b"authorization": f"Bearer {secret}".encode()}
    limit = samples.MAX_BODY_BYTES
    declared = {**auth, b"content-length": str(limit + 1).encode()}
    status, answer, read = call_asgi(declared, [b"x" * 1024] * 20)
    assert (status, answer["code"], read) == (413, "too_large", 0)
    # Chunked (no Content-Length): reading stops at the first chunk past the limit.
    chunk = 1024 * 1024
    status, answer, read = call_asgi(auth, [b" " * chunk] * (limit // chunk + 10))
    assert (status, answer["code"], read) == (413, "too_large", limit // chunk + 1)
    body = json.dumps({"host_id": host.pk, "samples": [good(host.gpus.get(index=0))]}).encode()
    pieces = [body[n : n + 7] for n in range(0, len(body), 7)]
    assert call_asgi(auth, pieces)[:2] == (202, {"accepted": 1, "ignored": 0})


def test_the_urlconf_view_checks_the_secret_before_the_body(register):
    big = "x" * (4 * 1024 * 1024)  # over DATA_UPLOAD_MAX_MEMORY_SIZE: reading it would be a 413
    assert_refused(post_raw("wrong-secret", big), 401, "invalid_secret")
    host, secret = register()
    assert_refused(post_raw(secret, big), 400, "parse_error")  # read (to its limit), then parsed


def test_a_rekeyed_or_deleted_hosts_secret_is_refused_at_its_next_batch(register):
    """The secret is looked up with every batch (no cache): the old one stops the moment the
    host gets a new one, and a deleted host's at once; a host without GPUs keeps nothing."""
    host, secret = register()
    gpu = host.gpus.get(index=0)

    def post(secret):
        batch = {"host_id": host.pk, "samples": [good(gpu)]}
        return post_json(agent_client_for(secret), "/agent/v1/samples", batch)

    assert post(secret).json() == {"accepted": 1, "ignored": 0}
    host.set_secret("a-new-secret")
    host.save()
    assert_refused(post(secret), 401, "invalid_secret")
    assert post("a-new-secret").json() == {"accepted": 1, "ignored": 0}
    host.gpus.all().delete()
    assert post("a-new-secret").json() == {"accepted": 0, "ignored": 1}
    host.delete()
    assert_refused(post("a-new-secret"), 401, "invalid_secret")


# --- finding 6: oversized bodies elsewhere -------------------------------------------------


def test_oversized_bodies_get_the_json_error(register, settings, token_client, tenant, make_member):
    """Finding 6: a body over DATA_UPLOAD_MAX_MEMORY_SIZE got Django's HTML 400 page."""
    from accounts.roles import Role

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    host, secret = register()
    big = json.dumps({"host_id": host.pk, "padding": "x" * 2000})
    agent = agent_client_for(secret)
    api = token_client(make_member(tenant, Role.OWNER))
    for client, url in (
        (agent, "/agent/v1/heartbeat"),
        (agent, "/agent/v1/register"),
        (api, "/api/v1/instances/"),
    ):
        response = client.post(url, data=big, content_type="application/json")
        assert_refused(response, 413, "too_large")
        assert "1000 bytes" in response.json()["detail"]
    page = Client().post("/login/", data={"padding": "x" * 2000})  # a page answers a page
    assert page.status_code == 400
    assert page["Content-Type"].startswith("text/html")
