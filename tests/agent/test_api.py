"""The agent's HTTP API contract, against one real standalone agent process.

GPU 0 and 1 are in mig mode, 2 shared, 3 whole.
"""

import hashlib
import json

import httpx
import pytest

from tests.agent.agents import SECRET, standalone

pytestmark = pytest.mark.integration

MIG_3G = {"mode": "mig", "gpus": [0], "mig": {"profile": "3g.40gb", "start": 4, "size": 4}}
SHARED_QUARTER = {"mode": "shared", "gpus": [2], "shared": {"milli": 250, "memory_mib": 20480}}
ALLOCATION_KEYS = {
    "id",
    "image",
    "image_digest",
    "container",
    "finished_at",
    "mode",
    "gpus",
    "gpu_uuids",
    "mig",
    "shared",
    "state",
    "reason",
    "exit_code",
    "pid",
    "env",
    "labels",
    "created_at",
    "updated_at",
}


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    state = tmp_path_factory.mktemp("api") / "state"
    with standalone(state, "--gpus", "4", "--mode", "mig,mig,shared,whole") as agent:
        yield agent


@pytest.fixture
def api(agent):
    """The agent's authenticated client; every allocation is deleted after the test."""
    yield agent.client
    for alloc in agent.client.get("/v1/allocations").json()["allocations"]:
        agent.client.delete(f"/v1/allocations/{alloc['id']}")


def ids(api) -> list[str]:
    return [a["id"] for a in api.get("/v1/allocations").json()["allocations"]]


def test_healthz_needs_no_secret(agent):
    assert httpx.get(f"{agent.url}/v1/healthz").json() == {"ok": True}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {SECRET}"},
        {"Authorization": SECRET},
    ],
    ids=["none", "wrong-secret", "wrong-scheme", "no-scheme"],
)
def test_unauthorized_calls_are_refused_and_do_nothing(agent, api, headers):
    with httpx.Client(base_url=agent.url, headers=headers) as anonymous:
        for method, path, body in [
            ("GET", "/v1/inventory", None),
            ("GET", "/v1/allocations", None),
            ("PUT", "/v1/allocations/sneaky", MIG_3G),
            ("POST", "/v1/allocations/sneaky/stop", None),
            ("DELETE", "/v1/allocations/sneaky", None),
            ("POST", "/v1/sim/faults", {"gpu": 0, "fault": "xid79"}),
        ]:
            response = anonymous.request(method, path, json=body)
            assert response.status_code == 401, (method, path)
            assert response.json()["error"] == "unauthorized"
    assert ids(api) == []
    assert all(gpu["healthy"] for gpu in api.get("/v1/inventory").json()["gpus"])


def test_inventory(api):
    inventory = api.get("/v1/inventory").json()
    assert inventory["hostname"] == "test-host"
    assert inventory["backend"] == "sim"
    assert inventory["runtime"] == "sim"
    assert inventory["cpu_count"] >= 1 and inventory["memory_mib"] > 0
    assert [g["mode"] for g in inventory["gpus"]] == ["mig", "mig", "shared", "whole"]
    gpu = inventory["gpus"][0]
    assert gpu["name"] == "NVIDIA A100-SXM4-80GB"
    assert gpu["model"] == "a100-80gb"
    assert gpu["memory_mib"] == 81920
    assert gpu["uuid"].startswith("GPU-") and len(gpu["uuid"]) == 40
    assert gpu["mig_enabled"] is True and gpu["healthy"] is True
    assert gpu["health_reason"] is None
    assert gpu["driver_version"] and gpu["cuda_version"]
    assert gpu["mig_devices"] == []
    rest = {key: value for key, value in inventory.items() if key != "digest"}
    canonical = json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()
    assert inventory["digest"] == hashlib.sha256(canonical).hexdigest()


def test_put_is_idempotent_and_conflicts_on_another_body(api):
    body = {**MIG_3G, "labels": {"instance": "i-1"}, "env": {"HF_HOME": "/data"}}
    created = api.put("/v1/allocations/a-1", json=body)
    assert created.status_code == 201
    alloc = created.json()
    assert set(alloc) == ALLOCATION_KEYS
    assert alloc["state"] == "running"
    assert alloc["labels"] == {"instance": "i-1"}
    assert alloc["mig"]["uuid"].startswith("MIG-")
    assert alloc["env"] == {"CUDA_VISIBLE_DEVICES": alloc["mig"]["uuid"]}
    assert alloc["created_at"].endswith("Z")

    again = api.put("/v1/allocations/a-1", json=body)
    assert again.status_code == 200
    assert again.json() == alloc

    other = api.put("/v1/allocations/a-1", json={**body, "labels": {"instance": "i-2"}})
    assert other.status_code == 409
    assert other.json()["error"] == "allocation_conflict"
    assert ids(api) == ["a-1"]

    devices = api.get("/v1/inventory").json()["gpus"][0]["mig_devices"]
    assert devices == [
        {
            "uuid": alloc["mig"]["uuid"],
            "profile": "3g.40gb",
            "start": 4,
            "size": 4,
            "memory_mib": 40192,
        }
    ]


@pytest.mark.parametrize(
    ("alloc_id", "body", "code", "words"),
    [
        ("b", "not json", "invalid_json", "JSON"),
        ("b", [1], "invalid_body", "object"),
        ("b", {"gpus": [3]}, "invalid_body", "mode"),
        ("b", {"mode": "whole", "gpus": [3], "colour": "red"}, "invalid_body", "colour"),
        ("b", {"mode": "whole", "gpus": "3"}, "invalid_body", "gpus"),
        ("b", {"mode": "whole", "gpus": [True]}, "invalid_body", "gpus"),
        ("b", {"mode": "whole", "gpus": []}, "invalid_body", "gpus"),
        ("b", {"mode": "whole", "gpus": [3, 3]}, "invalid_body", "twice"),
        ("b", {"mode": "hourly", "gpus": [3]}, "invalid_body", "mode"),
        ("b", {"mode": "whole", "gpus": [9]}, "unknown_gpu", "GPU 9"),
        ("b", {"mode": "whole", "gpus": [3], "command": "sleep 1"}, "invalid_body", "command"),
        ("b", {"mode": "whole", "gpus": [3], "env": {"A": 1}}, "invalid_body", "env"),
        (
            "b",
            {**MIG_3G, "mig": {"profile": "9g.99gb", "start": 0}},
            "unknown_mig_profile",
            "9g.99gb",
        ),
        (
            "b",
            {**MIG_3G, "mig": {"profile": "3g.40gb", "start": 2}},
            "illegal_mig_placement",
            "start",
        ),
        (
            "b",
            {**MIG_3G, "mig": {"profile": "3g.40gb", "start": 0, "size": 2}},
            "illegal_mig_placement",
            "slots",
        ),
        ("b", {**MIG_3G, "mig": {"profile": "3g.40gb"}}, "invalid_body", "start"),
        ("b", {**MIG_3G, "mig": None}, "invalid_body", "mig"),
        ("b", {**MIG_3G, "gpus": [0, 1]}, "invalid_body", "one GPU"),
        ("b", {"mode": "whole", "gpus": [3], "mig": MIG_3G["mig"]}, "invalid_body", "mig"),
        ("b", {**SHARED_QUARTER, "shared": {"milli": 0, "memory_mib": 1}}, "invalid_body", "milli"),
        (
            "b",
            {**SHARED_QUARTER, "shared": {"milli": 1001, "memory_mib": 1}},
            "invalid_body",
            "milli",
        ),
        ("b", {**SHARED_QUARTER, "shared": {"milli": 250}}, "invalid_body", "memory_mib"),
        ("b", {**SHARED_QUARTER, "sim": {"util": 150}}, "invalid_body", "util"),
        ("bad.id", {"mode": "whole", "gpus": [3]}, "invalid_id", "A-Za-z0-9"),
        ("x" * 65, {"mode": "whole", "gpus": [3]}, "invalid_id", "A-Za-z0-9"),
    ],
)
def test_bad_bodies_are_refused_with_a_reason(api, alloc_id, body, code, words):
    if isinstance(body, str):
        response = api.put(f"/v1/allocations/{alloc_id}", content=body)
    else:
        response = api.put(f"/v1/allocations/{alloc_id}", json=body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["error"] == code
    assert words in error["detail"]
    assert ids(api) == []


@pytest.mark.parametrize("action", ["stop", "start", "reboot"])
def test_unknown_allocation_is_404(api, action):
    response = api.post(f"/v1/allocations/nope/{action}")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


def test_unknown_route_answers_json(api):
    response = api.get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


def test_delete_is_idempotent_and_frees_the_slice(api):
    assert api.put("/v1/allocations/d-1", json=MIG_3G).status_code == 201
    assert api.delete("/v1/allocations/d-1").status_code == 204
    assert api.delete("/v1/allocations/d-1").status_code == 204
    assert api.delete("/v1/allocations/never-was").status_code == 204
    assert ids(api) == []
    assert api.get("/v1/inventory").json()["gpus"][0]["mig_devices"] == []
    assert api.put("/v1/allocations/d-2", json=MIG_3G).status_code == 201


def test_stop_start_reboot(api):
    api.put("/v1/allocations/s-1", json={"mode": "whole", "gpus": [3]})
    stopped = api.post("/v1/allocations/s-1/stop")
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"
    again = api.post("/v1/allocations/s-1/stop")
    assert again.status_code == 200 and again.json() == stopped.json()
    assert api.post("/v1/allocations/s-1/start").json()["state"] == "running"
    assert api.post("/v1/allocations/s-1/reboot").json()["state"] == "running"
    # a stopped allocation keeps its GPU until it is deleted
    api.post("/v1/allocations/s-1/stop")
    busy = api.put("/v1/allocations/s-2", json={"mode": "whole", "gpus": [3]})
    assert busy.status_code == 409 and busy.json()["error"] == "gpu_busy"


def test_mig_overlap_is_refused(api):
    assert api.put("/v1/allocations/m-1", json=MIG_3G).status_code == 201
    overlap = {"mode": "mig", "gpus": [0], "mig": {"profile": "1g.10gb", "start": 5}}
    response = api.put("/v1/allocations/m-2", json=overlap)
    assert response.status_code == 409
    assert response.json()["error"] == "mig_overlap"
    for start in (0, 1, 2, 3):
        fits = {"mode": "mig", "gpus": [0], "mig": {"profile": "1g.10gb", "start": start}}
        assert api.put(f"/v1/allocations/m-fit-{start}", json=fits).status_code == 201
    # the same slot on the other MIG GPU is free
    assert api.put("/v1/allocations/m-3", json={**MIG_3G, "gpus": [1]}).status_code == 201
    whole_gpu = {"mode": "mig", "gpus": [1], "mig": {"profile": "7g.80gb", "start": 0}}
    assert api.put("/v1/allocations/m-4", json=whole_gpu).json()["error"] == "mig_overlap"


def test_illegal_mig_start_is_refused(api):
    for profile, start in [
        ("1g.10gb", 7),
        ("1g.20gb", 1),
        ("2g.20gb", 6),
        ("4g.40gb", 4),
        ("7g.80gb", 1),
    ]:
        body = {"mode": "mig", "gpus": [0], "mig": {"profile": profile, "start": start}}
        response = api.put("/v1/allocations/illegal", json=body)
        assert response.status_code == 400, (profile, start)
        assert response.json()["error"] == "illegal_mig_placement"


def test_shared_oversubscription_is_refused(api):
    env = api.put("/v1/allocations/q-1", json=SHARED_QUARTER).json()["env"]
    assert env == {"CUDA_VISIBLE_DEVICES": api.get("/v1/inventory").json()["gpus"][2]["uuid"]}
    half = {"mode": "shared", "gpus": [2], "shared": {"milli": 500, "memory_mib": 40960}}
    assert api.put("/v1/allocations/q-2", json=half).status_code == 201
    too_much = {"mode": "shared", "gpus": [2], "shared": {"milli": 375, "memory_mib": 1024}}
    response = api.put("/v1/allocations/q-3", json=too_much)
    assert response.status_code == 409
    assert response.json()["error"] == "shared_capacity"
    assert "milli" in response.json()["detail"]
    too_big = {"mode": "shared", "gpus": [2], "shared": {"milli": 125, "memory_mib": 30000}}
    response = api.put("/v1/allocations/q-4", json=too_big)
    assert response.status_code == 409
    assert "MiB" in response.json()["detail"]
    eighth = {"mode": "shared", "gpus": [2], "shared": {"milli": 250, "memory_mib": 20480}}
    assert api.put("/v1/allocations/q-5", json=eighth).status_code == 201


def test_gpu_mode_must_match(api):
    for body in (
        {"mode": "whole", "gpus": [0]},
        {**SHARED_QUARTER, "gpus": [3]},
        {**MIG_3G, "gpus": [2]},
    ):
        response = api.put("/v1/allocations/wrong-mode", json=body)
        assert response.status_code == 409
        assert response.json()["error"] == "gpu_mode_mismatch"


def test_gpu_mode_changes_only_on_an_empty_gpu(api):
    gpu = api.put("/v1/gpus/3/mode", json={"mode": "shared"})
    assert gpu.status_code == 200 and gpu.json()["mode"] == "shared"
    try:
        assert (
            api.put("/v1/allocations/g-1", json={**SHARED_QUARTER, "gpus": [3]}).status_code == 201
        )
        busy = api.put("/v1/gpus/3/mode", json={"mode": "whole"})
        assert busy.status_code == 409 and busy.json()["error"] == "gpu_busy"
        api.delete("/v1/allocations/g-1")
    finally:
        assert api.put("/v1/gpus/3/mode", json={"mode": "whole"}).json()["mode"] == "whole"
    assert api.put("/v1/gpus/9/mode", json={"mode": "whole"}).status_code == 404
    for body in ({"mode": "sliced"}, {"mode": "whole", "extra": 1}, ["whole"]):
        response = api.put("/v1/gpus/3/mode", json=body)
        assert response.status_code == 400, body
