"""The nvml backend, against a fake pynvml module (there is no GPU here)."""

import asyncio
import subprocess

import httpx
import pynvml
import pytest

from agent.api import create_app
from agent.backends import nvml as nvml_backend
from agent.backends.nvml import NvmlBackend
from agent.errors import ApiError
from agent.host import Host
from agent.models import mig_profiles
from agent.runtime import SimRuntime
from agent.state import StateStore
from tests.agent.fake_nvml import MIB, FakeNvml, gpu, mig_device

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


@pytest.fixture
def nvml(monkeypatch):
    """make([gpu dicts], modes=None, manage_mig=False) -> (fake, backend)"""

    def make(gpus, modes=None, manage_mig=False):
        fake = FakeNvml(gpus)
        monkeypatch.setattr(nvml_backend, "pynvml", fake.module)
        return fake, NvmlBackend(modes, manage_mig)

    return make


def mig_a100(index: int) -> dict:
    return gpu(
        index,
        mig=(1, 1),
        mig_devices=[
            mig_device("MIG-aaaa", gi=1, start=0, size=4, slices=3, total_mib=40192),
            mig_device("MIG-bbbb", gi=2, start=6, size=2, slices=1, total_mib=19968),
        ],
    )


def _gpu_sample(samples, index):
    return next(s for s in samples if s["kind"] == "gpu" and s["gpu_index"] == index)


def test_inventory_fields(nvml):
    l4 = gpu(1, name="NVIDIA L4", total=23034 * MIB, mig=None)
    fake, backend = nvml([mig_a100(0), l4, gpu(2, mig=(0, 1))], modes=["mig", "shared", "whole"])
    first, second, third = backend.gpus()
    assert first == {
        "index": 0,
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "name": "NVIDIA A100-SXM4-80GB",
        "model": "a100-80gb",
        "pci_bus_id": "00000000:07:00.0",
        "memory_mib": 81920,
        "mode": "mig",
        "mig_enabled": True,
        "mig_pending": True,
        "healthy": True,
        "health_reason": None,
        "driver_version": "550.54.15",
        "cuda_version": "12.4",
        "mig_devices": [
            {"uuid": "MIG-aaaa", "profile": "3g.40gb", "start": 0, "size": 4, "memory_mib": 40192},
            {"uuid": "MIG-bbbb", "profile": "1g.20gb", "start": 6, "size": 2, "memory_mib": 19968},
        ],
    }
    assert (second["model"], second["mode"], second["memory_mib"]) == ("l4", "shared", 23034)
    assert (second["mig_enabled"], second["mig_pending"]) == (False, None)
    # MIG enabling is pending (needs a GPU reset): the agent reports it and leaves it be
    assert (third["mode"], third["mig_enabled"], third["mig_pending"]) == ("whole", False, True)
    assert fake.mutating_calls() == []


def test_lost_gpu_is_unhealthy_and_nothing_crashes(nvml):
    gpus = [gpu(0, util=55), gpu(1), gpu(2, mig=(1, 1))]
    fake, backend = nvml(gpus)
    backend.gpus()
    gpus[1]["lost"] = True  # falls off the bus after the agent saw it
    inventory = backend.gpus()
    assert inventory[1]["healthy"] is False
    assert inventory[1]["health_reason"].startswith("gpu_lost")
    assert inventory[1]["uuid"] == gpus[1]["uuid"]  # still known by its last identity
    assert [g["healthy"] for g in inventory] == [True, False, True]
    assert backend.lost_gpus() == {1}

    samples = backend.sample([])
    lost = _gpu_sample(samples, 1)
    assert lost["healthy"] is False
    assert lost["gpu_util"] is None and lost["temperature_c"] is None and lost["processes"] == []
    assert _gpu_sample(samples, 0)["gpu_util"] == 55

    gpus[1]["lost"] = False
    assert backend.gpus()[1]["healthy"] is True
    assert backend.lost_gpus() == set()


def test_a_gpu_lost_from_the_start_still_gets_an_entry(nvml):
    _, backend = nvml([gpu(0, lost=True), gpu(1)])
    lost, fine = backend.gpus()
    assert lost["healthy"] is False and lost["uuid"] is None
    assert fine["healthy"] is True


def test_unsupported_fields_are_null(nvml):
    errors = {
        name: NOT_SUPPORTED
        for name in (
            "nvmlDeviceGetTemperature",
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetClockInfo",
            "nvmlDeviceGetTotalEccErrors",
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetPciInfo",
            "nvmlDeviceGetProcessUtilization",
        )
    }
    _, backend = nvml([gpu(0, mig=None, errors=errors)])
    [entry] = backend.gpus()
    assert entry["healthy"] is True
    assert entry["pci_bus_id"] is None and entry["mig_pending"] is None
    [sample] = backend.sample([])
    assert sample["healthy"] is True
    assert sample["mem_used_mib"] == 512 and sample["mem_total_mib"] == 81920
    for field in ("gpu_util", "temperature_c", "power_w", "sm_clock_mhz", "ecc_errors"):
        assert sample[field] is None, field
    assert sample["processes"] == []


def test_mig_placement_needing_privileges_is_null(nvml):
    device = mig_a100(0)
    device["errors"] = {"nvmlDeviceGetGpuInstanceById": pynvml.NVML_ERROR_NO_PERMISSION}
    _, backend = nvml([device])
    first = backend.gpus()[0]["mig_devices"][0]
    assert (first["start"], first["size"], first["memory_mib"]) == (None, None, 40192)
    assert first["profile"] == "3g.39gb"  # named from its attributes


def test_ecc_errors_make_the_gpu_unhealthy(nvml):
    _, backend = nvml([gpu(0, ecc=2)])
    [entry] = backend.gpus()
    assert entry["healthy"] is False and entry["health_reason"].startswith("ecc")
    assert backend.sample([])[0]["ecc_errors"] == 2


@pytest.fixture
def workload():
    """A real process leading its own session, as the process runtime starts workloads."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc.pid
    proc.kill()
    proc.wait()


def test_samples_of_gpus_mig_devices_and_allocations(nvml, tmp_path, workload):
    me = workload
    shared_gpu = gpu(
        1,
        util=60,
        temp=64,
        power_mw=250500,
        sm=1410,
        used=9000 * MIB,
        processes=[(me, 3000 * MIB), (1, 6000 * MIB)],
        proc_util=[(me, 20), (1, 40)],
    )
    mig = mig_a100(0)
    mig["mig_devices"][0].update(used=1234 * MIB, processes=[(me, 1234 * MIB)])
    fake, backend = nvml(
        [mig, shared_gpu, gpu(2, util=90, used=70000 * MIB)], modes=["mig", "shared", "whole"]
    )
    host = Host("gpu-host", backend, SimRuntime(), StateStore(tmp_path))
    asyncio.run(
        host.put("m", {"mode": "mig", "gpus": [0], "mig": {"profile": "3g.40gb", "start": 0}})
    )
    shared = {"mode": "shared", "gpus": [1], "shared": {"milli": 500, "memory_mib": 8192}}
    asyncio.run(host.put("s", shared))
    asyncio.run(host.put("w", {"mode": "whole", "gpus": [2]}))
    host.allocations["s"].pid = workload  # its processes are those of the workload's session

    samples = host.poll()
    gpu1 = _gpu_sample(samples, 1)
    assert (gpu1["gpu_util"], gpu1["temperature_c"], gpu1["power_w"]) == (60, 64, 250.5)
    assert gpu1["sm_clock_mhz"] == 1410 and gpu1["ecc_errors"] == 0
    assert gpu1["processes"] == [{"pid": me, "used_mib": 3000}, {"pid": 1, "used_mib": 6000}]
    share = next(s for s in samples if s["allocation"] == "s")
    assert share["processes"] == [{"pid": me, "used_mib": 3000}]
    assert (share["mem_used_mib"], share["mem_total_mib"]) == (3000, 8192)
    assert share["gpu_util"] == 40.0  # 20% of the GPU is 40% of its half
    device = next(s for s in samples if s["kind"] == "mig" and s["mig_uuid"] == "MIG-aaaa")
    assert (device["mem_used_mib"], device["mem_total_mib"]) == (1234, 40192)
    assert device["processes"] == [{"pid": me, "used_mib": 1234}]
    mig_alloc = next(s for s in samples if s["allocation"] == "m")
    assert mig_alloc["mig_uuid"] == "MIG-aaaa" and mig_alloc["mem_used_mib"] == 1234
    whole = next(s for s in samples if s["allocation"] == "w")
    assert (whole["gpu_util"], whole["mem_used_mib"]) == (90, 70000)
    assert all(a.state == "running" for a in host.allocations.values())
    assert fake.mutating_calls() == []


def test_read_only_without_manage_mig(nvml):
    fake, backend = nvml([mig_a100(0)])
    profiles = mig_profiles("a100-80gb")
    assert backend.ensure_mig(0, profiles["3g.40gb"], 0) == "MIG-aaaa"
    with pytest.raises(ApiError) as refused:
        backend.ensure_mig(0, profiles["1g.10gb"], 4)
    assert refused.value.status == 409 and refused.value.code == "mig_device_missing"
    backend.release_mig(0, "MIG-aaaa")
    backend.sample([])
    assert fake.mutating_calls() == []
    assert len(fake.gpus[0]["mig_devices"]) == 2


def test_manage_mig_creates_and_destroys_gpu_instances(nvml):
    fake, backend = nvml([mig_a100(0)], manage_mig=True)
    profile = mig_profiles("a100-80gb")["1g.10gb"]
    created = backend.ensure_mig(0, profile, 4)
    assert created == "MIG-created-3"
    device = fake.gpus[0]["mig_devices"][-1]
    assert (device["start"], device["size"], device["slices"]) == (4, 1, 1)
    assert device["ci_profile"] == pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
    assert backend.ensure_mig(0, profile, 4) == created  # already there: not created twice
    assert fake.mutating_calls() == [
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlGpuInstanceCreateComputeInstance",
    ]
    backend.release_mig(0, created)
    assert [d["uuid"] for d in fake.gpus[0]["mig_devices"]] == ["MIG-aaaa", "MIG-bbbb"]


def test_api_on_nvml_has_no_fault_injection(nvml, tmp_path):
    _, backend = nvml([gpu(0)])
    host = Host("gpu-host", backend, SimRuntime(), StateStore(tmp_path))
    transport = httpx.ASGITransport(app=create_app(host, "s3cret"))

    async def calls():
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://agent",
            headers={"Authorization": "Bearer s3cret"},
        ) as client:
            inventory = await client.get("/v1/inventory")
            fault = await client.post("/v1/sim/faults", json={"gpu": 0, "fault": "xid79"})
            return inventory, fault

    inventory, fault = asyncio.run(calls())
    assert inventory.json()["backend"] == "nvml"
    assert fault.status_code == 404
    assert fault.json()["error"] == "not_found"


def test_modes_of_gpus_without_mig_are_chosen_but_mig_mode_is_never_changed(nvml):
    fake, backend = nvml([mig_a100(0), gpu(1)], modes=["whole"])
    backend.set_mode(1, "shared")
    assert backend.gpus()[1]["mode"] == "shared"
    for index, mode in ((0, "whole"), (1, "mig")):
        with pytest.raises(ApiError) as refused:
            backend.set_mode(index, mode)
        assert refused.value.code == "mode_unsupported"
        assert "never changes MIG mode" in refused.value.detail
    assert [g["mode"] for g in backend.gpus()] == ["mig", "shared"]
    assert fake.mutating_calls() == []
