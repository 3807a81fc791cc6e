"""The nvml backend against a fake pynvml that refuses where nvml.h does (there is no GPU
here): inventory, health, per-field errors, samples, modes, and NVML calls off the event loop.
MIG privileges, naming, creation and cleanup are in test_nvml_mig.py."""

import asyncio
import subprocess
import threading
import time

import httpx
import pynvml
import pytest

from agent.api import create_app
from agent.errors import ApiError
from agent.gpu_models import mig_profiles
from agent.host import LocalHost
from agent.identity import HostSecret
from agent.runtimes.sim import SimRuntime
from agent.state import StateStore
from tests.agent.fake_nvml import MIB, compute_instance, gpu, gpu_instance, mig_device

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
UNKNOWN = pynvml.NVML_ERROR_UNKNOWN


def mig_a100(index: int, **fields) -> dict:
    return gpu(
        index,
        mig=(1, 1),
        instances=[
            mig_device("MIG-aaaa", gi=1, start=0, profile="3g.40gb"),
            mig_device("MIG-bbbb", gi=2, start=6, profile="1g.20gb"),
        ],
        **fields,
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
            {
                "uuid": "MIG-aaaa",
                "profile": "3g.40gb",
                "start": 0,
                "size": 4,
                "memory_mib": 40192,
                "gpu_instance_id": 1,
                "compute_instance_id": 0,
            },
            {
                "uuid": "MIG-bbbb",
                "profile": "1g.20gb",
                "start": 6,
                "size": 2,
                "memory_mib": 19968,
                "gpu_instance_id": 2,
                "compute_instance_id": 0,
            },
        ],
    }
    assert (second["model"], second["mode"], second["memory_mib"]) == ("l4", "shared", 23034)
    assert (second["mig_enabled"], second["mig_pending"]) == (False, None)
    # MIG enabling is pending (needs a GPU reset): the agent reports it and leaves it be
    assert (third["mode"], third["mig_enabled"], third["mig_pending"]) == ("whole", False, True)
    assert fake.mutating_calls() == []


def test_lost_gpu_is_unhealthy_and_nothing_crashes(nvml):
    gpus = [gpu(0, util=55), gpu(1), mig_a100(2)]
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


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    ],
)
def test_only_the_errors_that_mean_a_failed_gpu_fail_it(nvml, code):
    gpus = [gpu(0)]
    _, backend = nvml(gpus)
    backend.gpus()
    gpus[0]["errors"] = {"nvmlDeviceGetPowerUsage": code}
    [sample] = backend.sample([])
    assert sample["healthy"] is False and sample["temperature_c"] is None
    assert backend.gpus()[0]["healthy"] is True  # the inventory reads no power


@pytest.mark.parametrize(
    "code", [UNKNOWN, pynvml.NVML_ERROR_TIMEOUT, pynvml.NVML_ERROR_NO_PERMISSION, NOT_SUPPORTED]
)
def test_any_other_error_nulls_only_its_field(nvml, code):
    """NVML_ERROR_UNKNOWN on the power reading: no power, the rest of the sample, and a GPU
    that stays healthy sample after sample."""
    _, backend = nvml([gpu(0, util=40, errors={"nvmlDeviceGetPowerUsage": code})])
    for _ in range(3):
        [sample] = backend.sample([])
        assert sample["healthy"] is True
        assert sample["power_w"] is None
        read = (sample["gpu_util"], sample["temperature_c"], sample["sm_clock_mhz"])
        assert read == (40, 31, 210)
        assert backend.gpus()[0]["healthy"] is True
    assert backend.lost_gpus() == set()


def test_an_unknown_error_on_identity_reads_keeps_the_gpu(nvml):
    gpus = [gpu(0)]
    _, backend = nvml(gpus)
    backend.gpus()
    gpus[0]["errors"] = {
        "nvmlDeviceGetUUID": UNKNOWN,
        "nvmlDeviceGetName": UNKNOWN,
        "nvmlDeviceGetPciInfo": UNKNOWN,
    }
    [entry] = backend.gpus()
    assert entry["healthy"] is True
    assert entry["uuid"] == gpus[0]["uuid"] and entry["name"] == "NVIDIA A100-SXM4-80GB"
    assert entry["pci_bus_id"] == "00000000:07:00.0"


def test_unsupported_fields_are_null(nvml):
    errors = {
        name: NOT_SUPPORTED
        for name in (
            "nvmlDeviceGetTemperatureV",
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
    assert backend.readings[0]["nvmlDeviceGetPowerUsage"] == "unsupported"
    assert backend.readings[0]["nvmlDeviceGetMemoryInfo"] == "ok"


def test_temperature_is_read_with_the_versioned_call(nvml):
    fake, backend = nvml([gpu(0, temp=57)])
    assert backend.sample([])[0]["temperature_c"] == 57
    assert "nvmlDeviceGetTemperatureV" in fake.calls
    assert "nvmlDeviceGetTemperature" not in fake.calls


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH]
)
def test_temperature_falls_back_on_drivers_without_the_versioned_call(nvml, code):
    fake, backend = nvml([gpu(0, temp=57, errors={"nvmlDeviceGetTemperatureV": code})])
    assert backend.sample([])[0]["temperature_c"] == 57
    assert "nvmlDeviceGetTemperature" in fake.calls


def test_ecc_errors_make_the_gpu_unhealthy(nvml):
    _, backend = nvml([gpu(0, ecc=2)])
    [entry] = backend.gpus()
    assert entry["healthy"] is False and entry["health_reason"].startswith("ecc")
    assert backend.sample([])[0]["ecc_errors"] == 2


def test_ecc_of_a_mig_gpu_is_read_per_mig_device(nvml):
    """nvml.h: volatile ECC counts of a MIG-enabled GPU come only from its MIG devices."""
    device = mig_a100(0)
    device["instances"][1]["cis"][0]["ecc"] = 3
    _, backend = nvml([device])
    [entry] = backend.gpus()
    assert entry["healthy"] is False and entry["health_reason"].startswith("ecc: 3")
    samples = backend.sample([])
    assert _gpu_sample(samples, 0)["ecc_errors"] == 3
    by_uuid = {s["mig_uuid"]: s for s in samples if s["kind"] == "mig"}
    assert by_uuid["MIG-bbbb"]["ecc_errors"] == 3 and by_uuid["MIG-bbbb"]["healthy"] is False
    assert by_uuid["MIG-aaaa"]["ecc_errors"] == 0


@pytest.fixture
def workload():
    """A real process leading its own session, as the process runtime starts workloads."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.mark.integration
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
    mig = mig_a100(0, temp=45, power_mw=120000, sm=1200)
    mig["instances"][0]["cis"][0].update(used=1234 * MIB, processes=[(me, 1234 * MIB)])
    fake, backend = nvml(
        [mig, shared_gpu, gpu(2, util=90, used=70000 * MIB)], modes=["mig", "shared", "whole"]
    )
    host = LocalHost("gpu-host", backend, SimRuntime(), StateStore(tmp_path))
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
    # the GPU's temperature, power and clock: NVML reads none of them per MIG device
    assert (device["temperature_c"], device["power_w"], device["sm_clock_mhz"]) == (45, 120.0, 1200)
    assert device["gpu_util"] is None  # no DCGM here: not available, not 0
    assert _gpu_sample(samples, 0)["gpu_util"] is None  # NOT_SUPPORTED on a MIG-enabled GPU
    mig_alloc = next(s for s in samples if s["allocation"] == "m")
    assert mig_alloc["mig_uuid"] == "MIG-aaaa" and mig_alloc["mem_used_mib"] == 1234
    assert mig_alloc["temperature_c"] == 45
    whole = next(s for s in samples if s["allocation"] == "w")
    assert (whole["gpu_util"], whole["mem_used_mib"]) == (90, 70000)
    assert all(a.state == "running" for a in host.allocations.values())
    assert fake.mutating_calls() == []


def test_mig_utilization_comes_from_dcgm(nvml):
    class Dcgm:
        def read(self):
            return {(0, 1): 73.5}

    _, backend = nvml([mig_a100(0)], dcgm=Dcgm())
    by_uuid = {s["mig_uuid"]: s for s in backend.sample([]) if s["kind"] == "mig"}
    assert by_uuid["MIG-aaaa"]["gpu_util"] == 73.5
    assert by_uuid["MIG-bbbb"]["gpu_util"] is None  # DCGM has no value for it: not 0


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
    assert len(fake.gpus[0]["instances"]) == 2


def test_api_on_nvml_has_no_fault_injection(nvml, tmp_path):
    _, backend = nvml([gpu(0)])
    host = LocalHost("gpu-host", backend, SimRuntime(), StateStore(tmp_path))
    transport = httpx.ASGITransport(app=create_app(host, HostSecret("s3cret")))

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


def test_a_hung_driver_does_not_stall_the_agent(nvml, tmp_path):
    """NVML runs on a worker thread: a call that hangs costs one timeout, then every call
    answers at once (GPUs unhealthy, "nvml_hung") until the driver answers again."""
    gpus = [gpu(0, util=30), mig_a100(1)]
    fake, backend = nvml(gpus, timeout=0.2)
    host = LocalHost("gpu-host", backend, SimRuntime(), StateStore(tmp_path))
    asyncio.run(host.put("w", {"mode": "whole", "gpus": [0]}))
    fake.stall = threading.Event()
    try:
        started = time.monotonic()
        inventory = backend.gpus()
        assert time.monotonic() - started < 2
        assert [g["healthy"] for g in inventory] == [False, False]
        assert inventory[0]["health_reason"].startswith("nvml_hung")
        assert inventory[0]["uuid"] == gpus[0]["uuid"]  # still known by its last identity

        started = time.monotonic()
        samples = host.poll()
        assert host.inventory()["gpus"][1]["health_reason"].startswith("nvml_hung")
        assert time.monotonic() - started < 0.2  # the stuck call is not waited for again
        assert [s["healthy"] for s in samples if s["kind"] == "gpu"] == [False, False]
        assert next(s for s in samples if s["allocation"] == "w")["gpu_util"] is None
        assert host.allocations["w"].state == "running"  # a hung driver is not a lost GPU
        with pytest.raises(ApiError) as refused:
            backend.ensure_mig(1, mig_profiles("a100-80gb")["1g.10gb"], 0)
        assert (refused.value.status, refused.value.code) == (503, "nvml_hung")
    finally:
        fake.stall.set()
    fake.stall = None
    time.sleep(0.05)
    assert [g["healthy"] for g in backend.gpus()] == [True, True]
    assert _gpu_sample(backend.sample([]), 0)["gpu_util"] == 30


def test_cis_of_a_gpu_are_found_whatever_their_order(nvml):
    """Compute instances listed after one another under one GPU instance, then another."""
    instances = [
        gpu_instance(
            3,
            "3g.40gb",
            4,
            [compute_instance("MIG-c1", 0, slices=1), compute_instance("MIG-c2", 1, slices=2)],
        ),
        mig_device("MIG-whole", gi=1, start=0, profile="4g.40gb"),
    ]
    _, backend = nvml([gpu(0, mig=(1, 1), instances=instances)])
    devices = backend.gpus()[0]["mig_devices"]
    assert [(d["uuid"], d["profile"], d["start"]) for d in devices] == [
        ("MIG-c1", "1c.3g.40gb", 4),
        ("MIG-c2", "2c.3g.40gb", 4),
        ("MIG-whole", "4g.40gb", 0),
    ]
