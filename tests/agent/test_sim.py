"""The sim backend: metrics that follow the workloads, faults, memory caps."""

import asyncio

import pytest

from agent.backends.sim import SimBackend
from agent.gpu_models import MODELS
from agent.host import LocalHost
from agent.runtimes.sim import SimRuntime
from agent.state import StateStore


@pytest.fixture
def make_host(tmp_path):
    def make(model: str, modes: list[str]) -> LocalHost:
        backend = SimBackend("sim-host", MODELS[model], modes)
        return LocalHost("sim-host", backend, SimRuntime(), StateStore(tmp_path / model))

    return make


def _put(host: LocalHost, alloc_id: str, body: dict):
    return asyncio.run(host.put(alloc_id, body))[1]


def _gpu(samples: list[dict], index: int) -> dict:
    return next(s for s in samples if s["kind"] == "gpu" and s["gpu_index"] == index)


def test_uuids_are_derived_from_host_and_index():
    one = SimBackend("node-1", MODELS["h200-141gb"], ["mig", "whole"]).gpus()
    again = SimBackend("node-1", MODELS["h200-141gb"], ["mig", "whole"]).gpus()
    other = SimBackend("node-2", MODELS["h200-141gb"], ["mig", "whole"]).gpus()
    assert [g["uuid"] for g in one] == [g["uuid"] for g in again]
    assert {g["uuid"] for g in one}.isdisjoint(g["uuid"] for g in other)
    assert one[0]["name"] == "NVIDIA H200" and one[0]["memory_mib"] == 143771


@pytest.mark.parametrize("model", ["a100-80gb", "l4"])
def test_metrics_follow_the_load(make_host, model):
    host = make_host(model, ["whole", "whole"])
    spec = MODELS[model]
    _put(host, "busy", {"mode": "whole", "gpus": [0], "sim": {"util": 90, "mem_mib": 12000}})
    for _ in range(20):
        samples = host.poll()
    busy, idle = _gpu(samples, 0), _gpu(samples, 1)
    assert 85 <= busy["gpu_util"] <= 95
    assert busy["mem_used_mib"] == 12000 and busy["mem_total_mib"] == spec.memory_mib
    assert busy["temperature_c"] > spec.max_temperature_c - 10
    assert busy["power_w"] > spec.idle_power_w + 0.8 * (spec.max_power_w - spec.idle_power_w)
    assert busy["sm_clock_mhz"] == spec.max_sm_clock_mhz
    assert idle["gpu_util"] == 0 and idle["mem_used_mib"] == 0
    assert idle["temperature_c"] < 32
    assert idle["power_w"] == pytest.approx(spec.idle_power_w, rel=0.03)
    whole = next(s for s in samples if s["allocation"] == "busy")
    assert whole["gpu_util"] == busy["gpu_util"] and whole["mem_used_mib"] == 12000


def test_shared_and_mig_loads_add_up_on_the_gpu(make_host):
    host = make_host("a100-80gb", ["shared", "mig"])
    for name, milli in (("a", 250), ("b", 500)):
        body = {
            "mode": "shared",
            "gpus": [0],
            "shared": {"milli": milli, "memory_mib": 16384},
            "sim": {"util": 100, "mem_mib": 8000},
        }
        _put(host, name, body)
    mig = {
        "mode": "mig",
        "gpus": [1],
        "mig": {"profile": "3g.40gb", "start": 0},
        "sim": {"util": 70},
    }
    _put(host, "m", mig)
    samples = host.poll()
    gpu0 = _gpu(samples, 0)
    assert 72 <= gpu0["gpu_util"] <= 78  # 100% of 1/4 + 100% of 1/2
    assert gpu0["mem_used_mib"] == 16000
    share = next(s for s in samples if s["allocation"] == "a")
    assert share["gpu_util"] >= 98 and share["mem_total_mib"] == 16384
    assert share["power_w"] == pytest.approx(gpu0["power_w"] / 4, abs=0.1)
    gpu1 = _gpu(samples, 1)
    assert 28 <= gpu1["gpu_util"] <= 32  # 70% of 3 of 7 compute slices
    device = next(s for s in samples if s["kind"] == "mig")
    assert 68 <= device["gpu_util"] <= 72 and device["mem_total_mib"] == 40192
    assert 10000 <= device["mem_used_mib"] <= 30000  # a default load within its 40 GB


def test_xid79_makes_the_gpu_lost_in_samples(make_host):
    host = make_host("a100-80gb", ["whole", "whole"])
    _put(host, "w", {"mode": "whole", "gpus": [0]})
    assert _gpu(host.poll(), 0)["healthy"] is True
    host.backend.inject(0, "xid79")
    samples = host.poll()
    lost = _gpu(samples, 0)
    assert lost["healthy"] is False
    assert lost["gpu_util"] is None and lost["mem_used_mib"] is None and lost["power_w"] is None
    assert _gpu(samples, 1)["healthy"] is True
    assert host.allocations["w"].state == "lost"
    assert host.allocations["w"].reason == "gpu_lost"
    gpu = host.inventory()["gpus"][0]
    assert gpu["healthy"] is False and "xid79" in gpu["health_reason"]
    host.backend.inject(0, "clear")
    assert _gpu(host.poll(), 0)["healthy"] is True


@pytest.mark.integration
def test_fault_injection_through_the_api(start_agent):
    agent = start_agent("--gpus", "2", "--mode", "whole,shared")
    api = agent.client
    api.put("/v1/allocations/w", json={"mode": "whole", "gpus": [0]})

    gpu = api.post("/v1/sim/faults", json={"gpu": 0, "fault": "xid79"}).json()
    assert gpu["healthy"] is False and gpu["health_reason"].startswith("xid79")
    assert api.get("/v1/inventory").json()["gpus"][0]["healthy"] is False
    lost = agent.allocation("w")
    assert (lost["state"], lost["reason"]) == ("lost", "gpu_lost")
    restart = api.post("/v1/allocations/w/start")
    assert restart.status_code == 409 and restart.json()["error"] == "gpu_unhealthy"
    api.delete("/v1/allocations/w")
    again = api.put("/v1/allocations/w2", json={"mode": "whole", "gpus": [0]})
    assert again.status_code == 409 and again.json()["error"] == "gpu_unhealthy"

    gpu = api.post("/v1/sim/faults", json={"gpu": 1, "fault": "ecc"}).json()
    assert gpu["healthy"] is False and gpu["health_reason"].startswith("ecc")
    for index in (0, 1):
        assert api.post("/v1/sim/faults", json={"gpu": index, "fault": "clear"}).json()["healthy"]
    assert api.put("/v1/allocations/w2", json={"mode": "whole", "gpus": [0]}).status_code == 201

    for body in ({"gpu": 5, "fault": "xid79"}, {"gpu": 0, "fault": "melt"}, {"gpu": 0}):
        response = api.post("/v1/sim/faults", json=body)
        assert response.status_code == 400, body


@pytest.mark.integration
def test_exceeding_the_memory_cap_fails_the_workload(start_agent):
    agent = start_agent("--gpus", "2", "--mode", "shared,mig")
    greedy = {
        "mode": "shared",
        "gpus": [0],
        "shared": {"milli": 250, "memory_mib": 20480},
        "sim": {"mem_mib": 30000},
    }
    modest = {**greedy, "sim": {"mem_mib": 20000}}
    assert agent.client.put("/v1/allocations/greedy", json=greedy).status_code == 201
    assert agent.client.put("/v1/allocations/modest", json=modest).status_code == 201
    mig = {
        "mode": "mig",
        "gpus": [1],
        "mig": {"profile": "1g.10gb", "start": 0},
        "sim": {"mem_mib": 10000},
    }
    agent.client.put("/v1/allocations/greedy-mig", json=mig)
    for name in ("greedy", "greedy-mig"):
        failed = agent.wait_state(name, "failed")
        assert failed["reason"] == "gpu_memory_cap"
    assert agent.allocation("modest")["state"] == "running"
