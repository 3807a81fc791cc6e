"""The nvml backend's MIG handling against the strict fake: without MIG privileges, names of
devices whose placement cannot be read, compute-instance splits and +me profiles, and MIG
instances never left behind (in use, failed creates, orphan GPU instances)."""

import asyncio
import logging

import pynvml
import pytest

from agent.backends.nvml.access import MigAccess
from agent.errors import ApiError
from agent.gpu_models import mig_profiles
from agent.host import LocalHost
from agent.runtimes.sim import SimRuntime
from agent.state import StateStore
from tests.agent.fake_nvml import MIB, compute_instance, gpu, gpu_instance, mig_device

A100 = mig_profiles("a100-80gb")
UNPRIVILEGED = MigAccess(root=False, cap_sys_admin=False, config=False, monitor=False)
UNKNOWN = pynvml.NVML_ERROR_UNKNOWN


def two_3g(index: int = 0, **fields) -> dict:
    return gpu(
        index,
        mig=(1, 1),
        instances=[
            mig_device("MIG-left", gi=1, start=0, profile="3g.40gb"),
            mig_device("MIG-right", gi=2, start=4, profile="3g.40gb"),
        ],
        **fields,
    )


def devices_of(backend, index=0) -> list[dict]:
    return backend.gpus()[index]["mig_devices"]


# --- without MIG privileges ------------------------------------------------------------------


def test_without_privileges_the_model_and_profiles_are_still_known(nvml, caplog):
    caplog.set_level(logging.WARNING, "agent.backends.nvml")
    fake, backend = nvml([two_3g(privileged=False)], access=UNPRIVILEGED)
    [entry] = backend.gpus()
    assert entry["model"] == "a100-80gb"  # by name: its memory is refused
    assert entry["memory_mib"] is None and entry["healthy"] is True
    assert [(d["uuid"], d["profile"], d["start"], d["size"]) for d in entry["mig_devices"]] == [
        ("MIG-left", "3g.40gb", None, 4),
        ("MIG-right", "3g.40gb", None, 4),
    ]
    # the start-up check says exactly what is missing, and how to grant it
    assert backend.mig_refused == {0: ["nvmlDeviceGetMemoryInfo", "nvmlDeviceGetGpuInstances"]}
    [warning] = [r.getMessage() for r in caplog.records if "MIG enabled" in r.getMessage()]
    assert "nvmlDeviceGetMemoryInfo, nvmlDeviceGetGpuInstances" in warning
    assert "mig/monitor" in warning and "root" in warning
    assert fake.mutating_calls() == []


def test_without_privileges_allocations_match_devices_by_slices_and_memory(nvml, tmp_path):
    _, backend = nvml([two_3g(privileged=False)], access=UNPRIVILEGED)
    host = LocalHost("gpu-host", backend, SimRuntime(), StateStore(tmp_path))

    def put(alloc_id, start):
        body = {"mode": "mig", "gpus": [0], "mig": {"profile": "3g.40gb", "start": start}}
        return asyncio.run(host.put(alloc_id, body))[1]

    right, left = put("a", 4), put("b", 0)
    assert {right.mig_uuid, left.mig_uuid} == {"MIG-left", "MIG-right"}
    # the same slot finds the same device again; a third 3g has none
    assert backend.ensure_mig(0, A100["3g.40gb"], 4) == right.mig_uuid
    with pytest.raises(ApiError) as refused:
        backend.ensure_mig(0, A100["4g.40gb"], 0)
    assert refused.value.code == "mig_device_missing"
    asyncio.run(host.delete("a"))
    assert put("c", 4).mig_uuid == right.mig_uuid  # released, handed out again


def test_an_h200_without_privileges_is_recognised_by_name(nvml):
    h200 = gpu(
        0,
        name="NVIDIA H200",
        total=143771 * MIB,
        mig=(1, 1),
        privileged=False,
        instances=[mig_device("MIG-h", gi=1, start=4, profile="3g.71gb")],
    )
    _, backend = nvml([h200], access=UNPRIVILEGED)
    [entry] = backend.gpus()
    assert entry["model"] == "h200-141gb"  # not "h200"
    [device] = entry["mig_devices"]
    assert (device["profile"], device["size"], device["start"]) == ("3g.71gb", 4, None)
    assert backend.ensure_mig(0, mig_profiles("h200-141gb")["3g.71gb"], 4) == "MIG-h"


def test_manage_mig_without_privileges_refuses_to_start(nvml):
    with pytest.raises(ValueError, match="--manage-mig needs") as refused:
        nvml([two_3g(privileged=False)], manage_mig=True, access=UNPRIVILEGED)
    assert "NVML refuses MIG readings on GPU 0" in str(refused.value)
    assert "mig/config" in str(refused.value)


def test_manage_mig_without_the_config_capability_refuses_to_start(nvml):
    """NVML lets this process read (mig/monitor) but the files say it may not change."""
    reader = MigAccess(root=False, cap_sys_admin=False, config=False, monitor=True)
    with pytest.raises(ValueError, match="no mig/config capability"):
        nvml([two_3g()], manage_mig=True, access=reader)


def test_manage_mig_on_a_host_without_mig_gpus_starts(nvml):
    _, backend = nvml([gpu(0)], manage_mig=True, access=UNPRIVILEGED)
    assert backend.gpus()[0]["healthy"] is True


# --- names ---------------------------------------------------------------------------------


def test_devices_are_named_as_nvidia_names_them_when_placement_is_unreadable(nvml):
    """No privileges and no profile info: NVIDIA's rule (memory rounded up to eighths of the
    GPU's memory) gives 3g.40gb, not round(40192 MiB / 1024) = 3g.39gb."""
    device = gpu(
        0,
        mig=(1, 1),
        privileged=False,
        instances=[
            mig_device("MIG-3g", gi=1, start=0, profile="3g.40gb"),
            mig_device("MIG-1g", gi=2, start=6, profile="1g.20gb"),
            mig_device("MIG-10", gi=3, start=4, profile="1g.10gb"),
        ],
        errors={"nvmlDeviceGetGpuInstanceProfileInfo": pynvml.NVML_ERROR_NO_PERMISSION},
    )
    _, backend = nvml([device], access=UNPRIVILEGED)
    names = [(d["profile"], d["size"]) for d in devices_of(backend)]
    assert names == [("3g.40gb", 4), ("1g.20gb", 2), ("1g.10gb", 1)]


def test_compute_instance_splits_are_not_whole_instances(nvml):
    split = gpu_instance(
        1,
        "3g.40gb",
        0,
        [compute_instance("MIG-1c", 0, slices=1), compute_instance("MIG-2c", 1, slices=2)],
    )
    for privileged in (True, False):
        _, backend = nvml(
            [gpu(0, mig=(1, 1), privileged=privileged, instances=[split])],
            access=None if privileged else UNPRIVILEGED,
        )
        names = [d["profile"] for d in devices_of(backend)]
        assert names == ["1c.3g.40gb", "2c.3g.40gb"]
        with pytest.raises(ApiError) as refused:
            backend.ensure_mig(0, A100["3g.40gb"], 0)
        expected = "mig_slots_taken" if privileged else "mig_device_missing"
        assert refused.value.code == expected


def test_media_extension_profiles_are_named_and_not_offered(nvml):
    """1g.10gb+me has the slices and memory of 1g.10gb: told apart by its profile (with
    privileges) or by its engines (without)."""
    for privileged in (True, False):
        media = gpu(
            0,
            mig=(1, 1),
            privileged=privileged,
            instances=[mig_device("MIG-me", gi=1, start=2, profile="1g.10gb+me")],
        )
        _, backend = nvml([media], access=None if privileged else UNPRIVILEGED)
        [device] = devices_of(backend)
        assert device["profile"] == "1g.10gb+me"
        with pytest.raises(ApiError):
            backend.ensure_mig(0, A100["1g.10gb"], 2)


def test_a_mig_device_whose_uuid_cannot_be_read_is_left_out(nvml):
    device = two_3g()
    device["instances"][0]["cis"][0]["errors"] = {"nvmlDeviceGetUUID": UNKNOWN}
    _, backend = nvml([device])
    [entry] = backend.gpus()
    assert entry["healthy"] is True
    assert [d["uuid"] for d in entry["mig_devices"]] == ["MIG-right"]
    samples = backend.sample([])
    assert [s["mig_uuid"] for s in samples if s["kind"] == "mig"] == ["MIG-right"]
    assert samples[0]["healthy"] is True


# --- creating and releasing ---------------------------------------------------------------


def test_manage_mig_creates_and_destroys_instances(nvml):
    fake, backend = nvml([two_3g()], manage_mig=True)
    instances = fake.gpus[0]["instances"]
    fake.gpus[0]["instances"] = instances[:1]  # slots 4-7 free
    profile = A100["1g.10gb"]
    created = backend.ensure_mig(0, profile, 4)
    assert created == "MIG-created-0-2-0"
    new = fake.gpus[0]["instances"][-1]
    assert (new["profile"], new["start"]) == ("1g.10gb", 4)
    assert new["cis"][0]["ci_profile"] == pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
    assert backend.ensure_mig(0, profile, 4) == created  # already there: not created twice
    assert fake.mutating_calls() == [
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlGpuInstanceCreateComputeInstance",
    ]
    backend.release_mig(0, created)
    assert [gi["id"] for gi in fake.gpus[0]["instances"]] == [1]


def test_a_mig_device_in_use_is_kept_with_its_allocation(nvml, tmp_path):
    fake, backend = nvml([two_3g()], manage_mig=True)
    host = LocalHost("gpu-host", backend, SimRuntime(), StateStore(tmp_path))
    body = {"mode": "mig", "gpus": [0], "mig": {"profile": "3g.40gb", "start": 4}}
    asyncio.run(host.put("m", body))
    ci = fake.gpus[0]["instances"][1]["cis"][0]
    ci["processes"] = [(4242, 100 * MIB)]  # a process still holds it
    with pytest.raises(ApiError) as busy:
        asyncio.run(host.delete("m"))
    assert (busy.value.status, busy.value.code) == (503, "mig_in_use")
    assert "m" in host.allocations  # not deleted: deleting again retries
    assert len(fake.gpus[0]["instances"]) == 2
    assert fake.calls.count("nvmlComputeInstanceDestroy") == 3  # tried, then retried

    ci["processes"] = []
    asyncio.run(host.delete("m"))
    assert "m" not in host.allocations
    assert [gi["id"] for gi in fake.gpus[0]["instances"]] == [1]


@pytest.mark.parametrize(
    "failing", ["nvmlGpuInstanceCreateComputeInstance", "nvmlGpuInstanceGetInfo"]
)
def test_a_failed_create_leaves_nothing_behind(nvml, failing):
    device = gpu(0, mig=(1, 1), errors={failing: pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES})
    fake, backend = nvml([device], manage_mig=True)
    with pytest.raises(ApiError) as failed:
        backend.ensure_mig(0, A100["3g.40gb"], 4)
    assert failed.value.code == "mig_error"
    assert fake.gpus[0]["instances"] == []
    assert fake.mutating_calls()[-1] == "nvmlGpuInstanceDestroy"


def test_what_a_failed_create_cannot_undo_is_reported_as_an_orphan(nvml, caplog):
    device = gpu(
        0,
        mig=(1, 1),
        errors={
            "nvmlGpuInstanceCreateComputeInstance": pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES,
            "nvmlGpuInstanceDestroy": UNKNOWN,
        },
    )
    fake, backend = nvml([device], manage_mig=True)
    with pytest.raises(ApiError):
        backend.ensure_mig(0, A100["3g.40gb"], 4)
    assert "left behind" in caplog.text
    [orphan] = devices_of(backend)
    assert orphan["uuid"] is None and orphan["orphan"]
    assert (orphan["profile"], orphan["start"], orphan["size"]) == ("3g.40gb", 4, 4)

    # the next try for that very profile and slot gives the orphan its compute instance
    fake.gpus[0]["errors"] = {}
    created = backend.ensure_mig(0, A100["3g.40gb"], 4)
    assert [gi["id"] for gi in fake.gpus[0]["instances"]] == [orphan["gpu_instance_id"]]
    assert [d["uuid"] for d in devices_of(backend)] == [created]


def test_orphan_gpu_instances_are_found_and_reported(nvml, tmp_path, caplog):
    """A GPU instance whose compute instance is gone has no MIG device handle: only
    nvmlDeviceGetGpuInstances shows it. It goes to the console in the heartbeat's inventory."""
    device = two_3g()
    device["instances"][1]["cis"] = []  # someone destroyed its compute instance
    fake, backend = nvml([device])
    host = LocalHost("gpu-host", backend, SimRuntime(), StateStore(tmp_path))
    inventory = host.inventory()
    orphan = inventory["gpus"][0]["mig_devices"][1]
    assert orphan == {
        "uuid": None,
        "profile": "3g.40gb",
        "start": 4,
        "size": 4,
        "memory_mib": 40192,
        "gpu_instance_id": 2,
        "orphan": "GPU instance without a compute instance: it holds its slots",
    }
    assert "GPU instance 2 (3g.40gb at slot 4) has no compute instance" in caplog.text
    with pytest.raises(ApiError) as missing:  # that profile at that slot: no CI to use
        backend.ensure_mig(0, A100["3g.40gb"], 4)
    assert missing.value.code == "mig_device_missing"
    assert "GPU instance 2 there has no compute instance" in missing.value.detail
    with pytest.raises(ApiError) as taken:  # another profile on its slots
        backend.ensure_mig(0, A100["1g.10gb"], 5)
    assert taken.value.code == "mig_slots_taken"
    assert "overlaps an orphan GPU instance 3g.40gb at slot 4" in taken.value.detail
    assert fake.mutating_calls() == []


def test_a_gpu_instance_left_by_a_half_done_release_is_destroyed_on_the_next(nvml):
    fake, backend = nvml([two_3g()], manage_mig=True)
    uuid = backend.ensure_mig(0, A100["3g.40gb"], 4)
    fake.gpus[0]["errors"] = {"nvmlGpuInstanceDestroy": UNKNOWN}
    with pytest.raises(ApiError) as failed:
        backend.release_mig(0, uuid)
    assert failed.value.code == "mig_error"
    assert devices_of(backend)[1]["uuid"] is None  # its compute instance went: an orphan now

    fake.gpus[0]["errors"] = {}
    backend.release_mig(0, uuid)
    assert [gi["id"] for gi in fake.gpus[0]["instances"]] == [1]


def test_the_fake_refuses_what_nvml_refuses(nvml):
    """The fake follows nvml.h where the backend depends on it."""
    from tests.agent.fake_nvml import FakeNvml

    fake = FakeNvml([two_3g(), gpu(1, mig=(0, 0)), two_3g(2, privileged=False)])
    nv = fake.module

    def code(fn, *args):
        with pytest.raises(pynvml.NVMLError) as refused:
            fn(*args)
        return refused.value.value

    mig_gpu, plain, unprivileged = (nv.nvmlDeviceGetHandleByIndex(i) for i in range(3))
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(mig_gpu, 0)
    not_supported = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert code(nv.nvmlDeviceGetUtilizationRates, mig_gpu) == not_supported
    assert code(nv.nvmlDeviceGetUtilizationRates, mig) == not_supported
    assert code(nv.nvmlDeviceGetProcessUtilization, mig_gpu, 0) == not_supported
    uncorrected, volatile = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
    assert code(nv.nvmlDeviceGetTotalEccErrors, mig_gpu, uncorrected, volatile) == not_supported
    assert nv.nvmlDeviceGetTotalEccErrors(mig, uncorrected, volatile) == 0
    assert nv.nvmlDeviceGetMaxMigDeviceCount(plain) == 0
    assert nv.nvmlDeviceGetMaxMigDeviceCount(mig_gpu) == 7
    assert code(nv.nvmlDeviceGetAttributes, mig_gpu) == not_supported
    no_permission = pynvml.NVML_ERROR_NO_PERMISSION
    assert code(nv.nvmlDeviceGetMemoryInfo, unprivileged) == no_permission
    assert code(nv.nvmlDeviceGetGpuInstanceById, unprivileged, 1) == no_permission
    assert code(nv.nvmlDeviceGetComputeRunningProcesses, unprivileged) == no_permission
    gi = nv.nvmlDeviceGetGpuInstanceById(mig_gpu, 1)
    assert code(nv.nvmlGpuInstanceDestroy, gi) == pynvml.NVML_ERROR_IN_USE
    assert len(fake.gpus[0]["instances"]) == 2
