"""The agent API over HTTP (Django's test client): register, heartbeat, samples; who may
speak, and what a malformed body gets (a 4xx with {code, detail}, never a 500)."""

import time

import pytest
from django.test import Client

from console.catalog.models import Mode
from console.fleet import services
from console.fleet.models import Gpu, Host, HostEvent
from tests.fleet.conftest import agent_client_for, make_inventory, post_json, with_digest

pytestmark = pytest.mark.django_db


def register_body(raw, hostname="host-x", region="local-1", **kwargs):
    return {
        "join_token": raw,
        "hostname": hostname,
        "address": "http://127.0.0.1:9101",
        "region": region,
        "agent_version": "0.1.0",
        "inventory": make_inventory(hostname, **kwargs),
    }


def sample(gpu, healthy=True, ts=None):
    """A GPU sample; `ts` is seconds after now (the console takes samples near its clock)."""
    return {
        "ts": time.time() + (ts or 0), "kind": "gpu", "gpu_index": gpu.index,
        "gpu_uuid": gpu.uuid, "mig_uuid": None, "allocation": None, "gpu_util": 12.5,
        "mem_used_mib": 100, "mem_total_mib": 81920, "temperature_c": 41.0, "power_w": 80.2,
        "sm_clock_mhz": 1410, "ecc_errors": 0, "healthy": healthy, "processes": [],
    }  # fmt: skip


def test_register_creates_host_and_gpus(region, a100):
    token, raw = services.create_join_token(region, note="rack 4")
    response = post_json(Client(), "/agent/v1/register", register_body(raw, gpus=3))
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {"host_id", "secret", "heartbeat_interval", "sample_interval"}
    host = Host.objects.get(pk=body["host_id"])
    assert host.name == "host-x" and host.region == region
    assert host.secret == body["secret"] and host.status == Host.Status.ACTIVE
    assert (host.vcpus, host.ram_mib, host.backend) == (64, 515000, "sim")
    assert host.last_heartbeat_at is not None
    assert [(g.index, g.model.code, g.mode) for g in host.gpus.all()] == [
        (0, "a100-80gb", "mig"),
        (1, "a100-80gb", "mig"),
        (2, "a100-80gb", "mig"),
    ]
    token.refresh_from_db()
    assert token.used_at is not None and token.host == host
    assert HostEvent.objects.filter(host=host, to_status="active").exists()


def test_used_token_refused_with_detail(region, a100):
    _, raw = services.create_join_token(region)
    assert post_json(Client(), "/agent/v1/register", register_body(raw)).status_code == 201
    response = post_json(Client(), "/agent/v1/register", register_body(raw, hostname="host-y"))
    assert response.status_code == 403
    assert response.json()["code"] == "join_token_used"
    assert "already used by host host-x" in response.json()["detail"]
    assert not Host.objects.filter(name="host-y").exists()


def test_unknown_and_expired_tokens_refused(region, a100):
    response = post_json(Client(), "/agent/v1/register", register_body("gpj_nope_nope"))
    assert (response.status_code, response.json()["code"]) == (403, "invalid_join_token")
    token, raw = services.create_join_token(region)
    services.revoke_join_token(token)
    response = post_json(Client(), "/agent/v1/register", register_body(raw))
    assert (response.status_code, response.json()["code"]) == (403, "join_token_expired")
    assert Host.objects.count() == 0


def test_hostname_taken_is_409_and_keeps_the_token(register, region):
    register("host-x")
    token, raw = services.create_join_token(region)
    response = post_json(Client(), "/agent/v1/register", register_body(raw, hostname="host-x"))
    assert response.status_code == 409
    assert response.json()["code"] == "hostname_taken"
    assert "'host-x' is already registered" in response.json()["detail"]
    token.refresh_from_db()
    assert token.used_at is None  # a refused registration does not burn the token


def test_unknown_gpu_model_is_400_naming_it(region, a100):
    _, raw = services.create_join_token(region)
    response = post_json(Client(), "/agent/v1/register", register_body(raw, model="b200-192gb"))
    assert response.status_code == 400
    assert response.json()["code"] == "unknown_gpu_model"
    assert "'b200-192gb'" in response.json()["detail"]
    assert Host.objects.count() == 0


def test_region_defaults_to_the_tokens_and_must_match_it(region, a100):
    _, raw = services.create_join_token(region)
    response = post_json(Client(), "/agent/v1/register", register_body(raw, region="eu-9"))
    assert (response.status_code, response.json()["code"]) == (400, "region_mismatch")
    response = post_json(Client(), "/agent/v1/register", register_body(raw, region=""))
    assert response.status_code == 201
    assert Host.objects.get().region == region


@pytest.mark.parametrize(
    "body",
    [
        [],
        "not an object",
        {},
        {"join_token": "x"},
        {"join_token": "x", "hostname": "h", "address": "http://a:1", "inventory": {}},
        {"join_token": "x", "hostname": "h", "address": "http://a:1", "inventory": {"gpus": [{}]}},
        {"join_token": "x", "hostname": "h", "address": "http://a:1", "inventory": {"gpus": "no"}},
    ],
)
def test_malformed_register_is_400(body, region):
    response = post_json(Client(), "/agent/v1/register", body)
    assert response.status_code == 400, response.content
    assert {"code", "detail"} <= set(response.json())


def test_register_detail_names_the_bad_field(region, a100):
    _, raw = services.create_join_token(region)
    body = register_body(raw)
    body["inventory"]["gpus"][1]["mode"] = "sliced"
    response = post_json(Client(), "/agent/v1/register", body)
    assert response.status_code == 400
    assert "inventory.gpus[1].mode" in response.json()["detail"]
    body = register_body(raw)
    body["inventory"]["gpus"][1]["uuid"] = body["inventory"]["gpus"][0]["uuid"]
    assert post_json(Client(), "/agent/v1/register", body).status_code == 400


def unreadable(gpu: dict) -> dict:
    """The agent's view of a GPU that fell off the bus before it could ever be read."""
    return {
        **gpu, "uuid": None, "name": None, "model": None, "pci_bus_id": None,
        "memory_mib": None, "healthy": False, "health_reason": "NVML: GPU is lost",
    }  # fmt: skip


def test_a_gpu_lost_before_it_was_read_does_not_stop_registration(region, a100):
    _, raw = services.create_join_token(region)
    body = register_body(raw, gpus=3)
    body["inventory"]["gpus"][1] = unreadable(body["inventory"]["gpus"][1])
    body["inventory"] = with_digest(body["inventory"])
    response = post_json(Client(), "/agent/v1/register", body)
    assert response.status_code == 201, response.content
    host = Host.objects.get(pk=response.json()["host_id"])
    assert sorted(host.gpus.values_list("index", flat=True)) == [0, 2]

    # read at last: the GPU gets its row
    inventory = make_inventory("host-x", gpus=3)
    secret = response.json()["secret"]
    beat = {"host_id": host.pk, "inventory_digest": inventory["digest"], "inventory": inventory}
    assert post_json(agent_client_for(secret), "/agent/v1/heartbeat", beat).status_code == 200
    assert host.gpus.filter(healthy=True).count() == 3


def test_an_unreadable_gpu_in_a_known_slot_is_unhealthy_not_missing(register):
    host, secret = register("host-x", gpus=2)
    inventory = make_inventory("host-x", gpus=2)
    inventory["gpus"][0] = unreadable(inventory["gpus"][0])
    beat = {"host_id": host.pk, "inventory_digest": "after-restart", "inventory": inventory}
    assert post_json(agent_client_for(secret), "/agent/v1/heartbeat", beat).status_code == 200
    gpu = host.gpus.get(index=0)
    assert (gpu.healthy, gpu.health_reason) == (False, "NVML: GPU is lost")
    assert gpu.uuid == "GPU-host-x-0"


def test_a_gpu_without_uuid_must_be_unhealthy(region, a100):
    _, raw = services.create_join_token(region)
    body = register_body(raw, gpus=2)
    body["inventory"]["gpus"][1] = {**unreadable(body["inventory"]["gpus"][1]), "healthy": True}
    response = post_json(Client(), "/agent/v1/register", body)
    assert response.status_code == 400
    assert "inventory.gpus[1].uuid" in response.json()["detail"]
    assert not Host.objects.exists()


def test_register_rejects_non_json_and_broken_json(region):
    client = Client()
    assert (
        client.post("/agent/v1/register", data="{nope", content_type="application/json").status_code
        == 400
    )
    assert client.post("/agent/v1/register", data={"join_token": "x"}).status_code == 415
    assert client.get("/agent/v1/register").status_code == 405


def test_heartbeat_and_samples_need_the_hosts_secret(register):
    host, secret = register()
    body = {"host_id": host.pk, "inventory_digest": host.inventory_digest}
    for url in ("/agent/v1/heartbeat", "/agent/v1/samples"):
        assert post_json(Client(), url, body).status_code == 401
        response = post_json(agent_client_for("wrong-secret"), url, body)
        assert response.status_code == 401
        assert response.json()["code"] == "invalid_secret"
        tampered = secret[:-1] + ("A" if secret[-1] != "A" else "B")
        assert post_json(agent_client_for(tampered), url, body).status_code == 401
    ok = post_json(agent_client_for(secret), "/agent/v1/heartbeat", body)
    assert ok.status_code == 200, ok.content


def test_a_host_cannot_speak_for_another(register):
    host_a, secret_a = register("host-a")
    host_b, _ = register("host-b")
    before = Host.objects.get(pk=host_b.pk).last_heartbeat_at
    inventory = make_inventory("host-b", gpus=4)
    inventory["gpus"][0]["healthy"] = False
    inventory["gpus"][0]["health_reason"] = "xid79"
    response = post_json(
        agent_client_for(secret_a),
        "/agent/v1/heartbeat",
        {"host_id": host_b.pk, "inventory_digest": "changed", "inventory": inventory},
    )
    assert response.status_code == 403
    assert response.json()["code"] == "wrong_host"
    gpu = host_b.gpus.get(index=0)
    response = post_json(
        agent_client_for(secret_a),
        "/agent/v1/samples",
        {"host_id": host_b.pk, "samples": [sample(gpu, healthy=False)]},
    )
    assert response.status_code == 403
    host_b.refresh_from_db()
    assert host_b.last_heartbeat_at == before
    assert Gpu.objects.filter(host=host_b, healthy=False).count() == 0


@pytest.mark.parametrize(
    "body",
    [
        [],
        {},
        {"host_id": "one"},
        {"host_id": None, "samples": []},
        {"samples": []},
        {"host_id": 1, "samples": "lots"},
        {"host_id": 1, "samples": [1, 2]},
        {"host_id": 1, "samples": [{}]},
        {"host_id": 1, "samples": [{"ts": "yesterday", "kind": "gpu", "gpu_index": 0}]},
    ],
)
def test_malformed_samples_and_heartbeats_are_400(register, body):
    host, secret = register()
    if isinstance(body, dict) and body.get("host_id") == 1:
        body = {**body, "host_id": host.pk}
    client = agent_client_for(secret)
    response = post_json(client, "/agent/v1/samples", body)
    assert response.status_code == 400, response.content
    assert {"code", "detail"} <= set(response.json())
    if not (isinstance(body, dict) and "samples" in body):
        assert post_json(client, "/agent/v1/heartbeat", body).status_code == 400
    bad = client.post("/agent/v1/samples", data="[{", content_type="application/json")
    assert bad.status_code == 400


def test_malformed_heartbeat_inventory_is_400(register):
    host, secret = register()
    body = {"host_id": host.pk, "inventory_digest": "x", "inventory": {"gpus": [{"index": -1}]}}
    response = post_json(agent_client_for(secret), "/agent/v1/heartbeat", body)
    assert response.status_code == 400
    assert "inventory.gpus[0]" in response.json()["detail"]


def test_samples_accepted_and_update_health(register):
    host, secret = register()
    gpu0, gpu1 = host.gpus.get(index=0), host.gpus.get(index=1)
    body = {
        "host_id": host.pk,
        "samples": [
            sample(gpu0, healthy=False, ts=-3.0),
            sample(gpu1, healthy=False, ts=-3.0),
            sample(gpu1, healthy=True, ts=-2.0),  # the latest wins
            {**sample(gpu0), "kind": "allocation", "allocation": "a-1", "healthy": True},
        ],
    }
    response = post_json(agent_client_for(secret), "/agent/v1/samples", body)
    assert response.status_code == 202, response.content
    gpu0.refresh_from_db()
    gpu1.refresh_from_db()
    assert not gpu0.healthy and gpu0.health_reason
    assert gpu1.healthy
    body = {"host_id": host.pk, "samples": [sample(gpu0, healthy=True, ts=1.0)]}
    assert post_json(agent_client_for(secret), "/agent/v1/samples", body).status_code == 202
    gpu0.refresh_from_db()
    assert gpu0.healthy and gpu0.health_reason == ""


def test_heartbeat_answers_the_hosts_status(register):
    host, secret = register()
    services.set_host_status(host, Host.Status.CORDONED)
    body = {"host_id": host.pk, "agent_version": "0.2.0", "inventory_digest": host.inventory_digest}
    response = post_json(agent_client_for(secret), "/agent/v1/heartbeat", body)
    assert response.status_code == 200
    assert response.json()["status"] == "cordoned"
    host.refresh_from_db()
    assert host.agent_version == "0.2.0"
    assert Mode.MIG in host.gpus.values_list("mode", flat=True)


@pytest.mark.django_db(transaction=True)
def test_the_asgi_server_answers_samples_itself(register):
    """console.asgi serves POST /agent/v1/samples without Django's stack: same answers."""
    import asyncio

    import httpx

    from console.asgi import application

    host, secret = register()
    gpu = host.gpus.get(index=0)

    async def post(body, token=secret):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            return await client.post(
                "/agent/v1/samples", json=body, headers={"Authorization": f"Bearer {token}"}
            )

    ok = asyncio.run(post({"host_id": host.pk, "samples": [sample(gpu, healthy=False)]}))
    assert ok.status_code == 202
    assert ok.json() == {"accepted": 1, "ignored": 0}
    gpu.refresh_from_db()
    assert not gpu.healthy
    assert asyncio.run(post({"host_id": host.pk, "samples": []}, token="nope")).status_code == 401
    wrong = asyncio.run(post({"host_id": host.pk + 1, "samples": []}))
    assert (wrong.status_code, wrong.json()["code"]) == (403, "wrong_host")
    bad = asyncio.run(post({"host_id": host.pk, "samples": [{"kind": "gpu"}]}))
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid")


def test_the_ssh_gateway_of_the_inventory_is_kept_and_checked(register):
    host, secret = register()
    gateway = {"port": 2222, "host_key_fingerprint": "SHA256:" + "A" * 43}
    inventory = with_digest({**make_inventory("host-x"), "ssh": gateway})
    body = {"host_id": host.pk, "inventory_digest": inventory["digest"], "inventory": inventory}
    assert post_json(agent_client_for(secret), "/agent/v1/heartbeat", body).status_code == 200
    host.refresh_from_db()
    assert (host.ssh_port, host.ssh_host_key_fingerprint) == (2222, gateway["host_key_fingerprint"])

    bad = with_digest({**inventory, "ssh": {"port": 70000, "host_key_fingerprint": "md5:x"}})
    body = {"host_id": host.pk, "inventory_digest": bad["digest"], "inventory": bad}
    response = post_json(agent_client_for(secret), "/agent/v1/heartbeat", body)
    assert response.status_code == 400
    assert "inventory.ssh.port" in response.json()["detail"]

    off = with_digest({**inventory, "ssh": None})
    body = {"host_id": host.pk, "inventory_digest": off["digest"], "inventory": off}
    assert post_json(agent_client_for(secret), "/agent/v1/heartbeat", body).status_code == 200
    host.refresh_from_db()
    assert host.ssh_port is None
