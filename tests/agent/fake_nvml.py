"""A stand-in for the pynvml module that refuses where nvml.h says the real library refuses
(nvml.h 13.3, as vendored by NVIDIA/go-nvml): GPUs described by dicts, pynvml's own constants
and error classes, and every call recorded.

A GPU dict (`gpu()`) holds uuid, name, bus_id, total/used (bytes), util, temp, power_mw, sm, ecc,
mig ((current, pending) or None when MIG is not supported), instances (its GPU instances, each
with its compute instances: `gpu_instance()`, `compute_instance()`, or `mig_device()` for both),
processes ([(pid, used bytes)]), proc_util ([(pid, sm util)]), errors ({function name: NVML
error code}, for every handle of that GPU), lost (every call fails with GPU_IS_LOST) and
privileged (False: the process has no MIG privileges: not root, no mig capabilities).

What nvml.h says, and the fake does:
- On a MIG-enabled GPU, utilization and process utilization are NOT_SUPPORTED (on the GPU and
  on its MIG devices); volatile ECC counts come only per MIG device; the GPU's own memory info
  and running processes need privileges ("only if the caller has appropriate privileges").
- "Requires privileged user": listing GPU instances, getting one by id, creating and destroying
  GPU and compute instances, getting a compute instance by id: NO_PERMISSION without.
- nvmlGpuInstanceDestroy: IN_USE while compute instances are active on the GPU instance;
  nvmlComputeInstanceDestroy: IN_USE while processes run on it.
- nvmlDeviceGetMaxMigDeviceCount: 0 unless MIG is enabled. nvmlDeviceGetAttributes: MIG device
  handles only. Temperature, power and clocks are the GPU's: NOT_SUPPORTED on a MIG device.
- GPU instance profiles as an A100-SXM4-80GB lists them (`nvidia-smi mig -lgip`: ids 19, 20,
  15, 14, 9, 5, 0), or an H200 (its sizes: the A100's shares of memory, as NVIDIA's naming
  rule expects).
"""

import ctypes
import types

import pynvml

MIB = 1024 * 1024
ONE_SLOT = tuple(range(7))
# (profile constant, id, compute slices, memory MiB, instances, legal starts, memory slots,
#  (decoders, encoders, JPEG, OFA), name)
A100_80GB = (
    ("1_SLICE", 19, 1, 9728, 7, ONE_SLOT, 1, (0, 0, 0, 0), "1g.10gb"),
    ("1_SLICE_REV1", 20, 1, 9728, 1, ONE_SLOT, 1, (1, 0, 1, 1), "1g.10gb+me"),
    ("1_SLICE_REV2", 15, 1, 19968, 4, (0, 2, 4, 6), 2, (1, 0, 0, 0), "1g.20gb"),
    ("2_SLICE", 14, 2, 19968, 3, (0, 2, 4), 2, (1, 0, 0, 0), "2g.20gb"),
    ("3_SLICE", 9, 3, 40192, 2, (0, 4), 4, (2, 0, 0, 0), "3g.40gb"),
    ("4_SLICE", 5, 4, 40192, 1, (0,), 4, (2, 0, 0, 0), "4g.40gb"),
    ("7_SLICE", 0, 7, 81152, 1, (0,), 8, (5, 0, 1, 1), "7g.80gb"),
)
H200 = (  # the A100's shares of its memory, applied to the H200's 143771 MiB
    ("1_SLICE", 19, 1, 17152, 7, ONE_SLOT, 1, (1, 0, 1, 0), "1g.18gb"),
    ("1_SLICE_REV2", 15, 1, 34560, 4, (0, 2, 4, 6), 2, (1, 0, 1, 0), "1g.35gb"),
    ("2_SLICE", 14, 2, 34560, 3, (0, 2, 4), 2, (2, 0, 2, 0), "2g.35gb"),
    ("3_SLICE", 9, 3, 70656, 2, (0, 4), 4, (3, 0, 3, 0), "3g.71gb"),
    ("4_SLICE", 5, 4, 70656, 1, (0,), 4, (4, 0, 4, 0), "4g.71gb"),
    ("7_SLICE", 0, 7, 142336, 1, (0,), 8, (7, 0, 7, 1), "7g.141gb"),
)
CI_SLICES = {
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}
# functions nvml.h marks "Requires privileged user"
PRIVILEGED = frozenset(
    {
        "nvmlDeviceGetGpuInstances",
        "nvmlDeviceGetGpuInstanceById",
        "nvmlDeviceGetGpuInstancePossiblePlacements",
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlGpuInstanceDestroy",
        "nvmlGpuInstanceCreateComputeInstance",
        "nvmlGpuInstanceGetComputeInstanceById",
        "nvmlComputeInstanceDestroy",
    }
)


def gpu(index: int, **fields) -> dict:
    """An idle A100-80GB without MIG, changed by `fields`."""
    return {
        "uuid": f"GPU-00000000-0000-0000-0000-00000000000{index}",
        "name": "NVIDIA A100-SXM4-80GB",
        "bus_id": f"00000000:{0x07 + index:02X}:00.0",
        "total": 81920 * MIB,
        "used": 512 * MIB,
        "util": 0,
        "temp": 31,
        "power_mw": 61000,
        "sm": 210,
        "ecc": 0,
        "mig": (0, 0),
        "instances": [],
        "processes": [],
        "proc_util": [],
        "errors": {},
        "lost": False,
        "privileged": True,
        **fields,
    }


def compute_instance(uuid: str, ci: int = 0, slices: int | None = None, **more) -> dict:
    """A compute instance (a MIG device): `slices` None takes its whole GPU instance."""
    return {
        "uuid": uuid,
        "id": ci,
        "slices": slices,
        "used": 0,
        "processes": [],
        "ecc": 0,
        "errors": {},
        **more,
    }


def gpu_instance(gi: int, profile: str, start: int, cis=()) -> dict:
    return {"id": gi, "profile": profile, "start": start, "cis": list(cis)}


def mig_device(uuid: str, gi: int, start: int, profile: str, **ci_fields) -> dict:
    """A GPU instance with one compute instance taking all of it."""
    return gpu_instance(gi, profile, start, [compute_instance(uuid, **ci_fields)])


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _ns(**fields) -> types.SimpleNamespace:
    return types.SimpleNamespace(**fields)


def _profiles(gpu: dict) -> tuple:
    return H200 if "H200" in gpu["name"] else A100_80GB


def _profile(gpu: dict, name: str) -> tuple:
    return next(p for p in _profiles(gpu) if p[8] == name)


def _mig_on(gpu: dict) -> bool:
    return bool(gpu["mig"] and gpu["mig"][0])


class FakeNvml:
    def __init__(self, gpus: list[dict]):
        self.gpus = gpus
        self.calls: list[str] = []
        self.stall = None  # a threading.Event: every call waits until it is set
        self.module = types.ModuleType("pynvml")
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError", "c_nvml", "nvmlTemperature")):
                setattr(self.module, name, getattr(pynvml, name))
        # GPU instance handles in ctypes arrays (nvmlDeviceGetGpuInstances): any Python object
        self.module.c_nvmlGpuInstance_t = ctypes.py_object
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(self.module, name, self._recorded(name, getattr(self, name)))

    def _recorded(self, name, fn):
        def call(*args):
            self.calls.append(name)
            if self.stall is not None:
                self.stall.wait()
            return fn(*args)

        call.__name__ = name
        return call

    def mutating_calls(self) -> list[str]:
        verbs = ("Set", "Create", "Destroy", "Reset", "Clear")
        return [name for name in self.calls if any(verb in name for verb in verbs)]

    # handles: ("gpu", index), ("mig", index, gi, ci), ("gi", index, gi), ("ci", index, gi, ci)

    def _gpu(self, handle, fn: str) -> dict:
        gpu = self.gpus[handle[1]]
        if gpu["lost"]:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in gpu["errors"]:
            raise _error(gpu["errors"][fn])
        if fn in PRIVILEGED and not gpu["privileged"]:
            raise _error(pynvml.NVML_ERROR_NO_PERMISSION)
        return gpu

    def _gi(self, gpu: dict, gi_id: int, missing=pynvml.NVML_ERROR_NOT_FOUND) -> dict:
        for instance in gpu["instances"]:
            if instance["id"] == gi_id:
                return instance
        raise _error(missing)

    def _ci(self, instance: dict, ci_id: int, missing=pynvml.NVML_ERROR_NOT_FOUND) -> dict:
        for ci in instance["cis"]:
            if ci["id"] == ci_id:
                return ci
        raise _error(missing)

    def _mig(self, handle, fn: str) -> tuple[dict, dict, dict]:
        """(GPU, GPU instance, compute instance) of a MIG device handle; a stale one is invalid."""
        gpu = self._gpu(handle, fn)
        invalid = pynvml.NVML_ERROR_INVALID_ARGUMENT
        instance = self._gi(gpu, handle[2], invalid)
        ci = self._ci(instance, handle[3], invalid)
        if fn in ci["errors"]:
            raise _error(ci["errors"][fn])
        return gpu, instance, ci

    def _parent(self, handle, fn: str) -> dict:
        """The GPU of a GPU handle; MIG device handles are refused (not supported)."""
        gpu = self._gpu(handle, fn)
        if handle[0] == "mig":
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _mig_enabled(self, handle, fn: str) -> dict:
        gpu = self._gpu(handle, fn)
        if not _mig_on(gpu):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    # system

    def nvmlInit(self):
        return None

    def nvmlShutdown(self):
        return None

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlSystemGetNVMLVersion(self):
        return "12.550.54.15"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    # identity

    def nvmlDeviceGetHandleByIndex(self, index):
        handle = ("gpu", index)
        self._gpu(handle, "nvmlDeviceGetHandleByIndex")
        return handle

    def nvmlDeviceGetUUID(self, handle):
        if handle[0] == "mig":
            return self._mig(handle, "nvmlDeviceGetUUID")[2]["uuid"]
        return self._gpu(handle, "nvmlDeviceGetUUID")["uuid"]

    def nvmlDeviceGetName(self, handle):
        return self._gpu(handle, "nvmlDeviceGetName")["name"]

    def nvmlDeviceGetPciInfo(self, handle):
        return _ns(busId=self._gpu(handle, "nvmlDeviceGetPciInfo")["bus_id"].encode())

    def nvmlDeviceGetMemoryInfo(self, handle):
        fn = "nvmlDeviceGetMemoryInfo"
        if handle[0] == "mig":
            gpu, instance, ci = self._mig(handle, fn)
            total = _profile(gpu, instance["profile"])[3] * MIB
            return _ns(total=total, used=ci["used"], free=total - ci["used"])
        gpu = self._gpu(handle, fn)
        if _mig_on(gpu) and not gpu["privileged"]:
            raise _error(pynvml.NVML_ERROR_NO_PERMISSION)
        return _ns(total=gpu["total"], used=gpu["used"], free=gpu["total"] - gpu["used"])

    # metrics

    def nvmlDeviceGetUtilizationRates(self, handle):
        gpu = self._parent(handle, "nvmlDeviceGetUtilizationRates")
        if _mig_on(gpu):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _ns(gpu=gpu["util"], memory=0)

    def nvmlDeviceGetTemperatureV(self, handle, sensor, version=pynvml.nvmlTemperature_v1):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._parent(handle, "nvmlDeviceGetTemperatureV")["temp"]

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._parent(handle, "nvmlDeviceGetTemperature")["temp"]

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._parent(handle, "nvmlDeviceGetPowerUsage")["power_mw"]

    def nvmlDeviceGetClockInfo(self, handle, clock):
        assert clock == pynvml.NVML_CLOCK_SM
        return self._parent(handle, "nvmlDeviceGetClockInfo")["sm"]

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter):
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        assert counter == pynvml.NVML_VOLATILE_ECC
        fn = "nvmlDeviceGetTotalEccErrors"
        if handle[0] == "mig":
            return self._mig(handle, fn)[2]["ecc"]
        gpu = self._gpu(handle, fn)
        if _mig_on(gpu):  # "Querying volatile errors using device handles is not supported"
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu["ecc"]

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        fn = "nvmlDeviceGetComputeRunningProcesses"
        if handle[0] == "mig":
            procs = self._mig(handle, fn)[2]["processes"]
        else:
            gpu = self._gpu(handle, fn)
            procs = list(gpu["processes"])
            if _mig_on(gpu):
                if not gpu["privileged"]:
                    raise _error(pynvml.NVML_ERROR_NO_PERMISSION)
                for instance in gpu["instances"]:
                    for ci in instance["cis"]:
                        procs += ci["processes"]
        return [_ns(pid=pid, usedGpuMemory=used) for pid, used in procs]

    def nvmlDeviceGetProcessUtilization(self, handle, last_seen):
        gpu = self._parent(handle, "nvmlDeviceGetProcessUtilization")
        if _mig_on(gpu):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not gpu["proc_util"]:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return [_ns(pid=pid, smUtil=sm, timeStamp=last_seen + 1) for pid, sm in gpu["proc_util"]]

    # MIG: reading

    def nvmlDeviceGetMigMode(self, handle):
        mig = self._parent(handle, "nvmlDeviceGetMigMode")["mig"]
        if mig is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(mig)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return 7 if _mig_on(self._parent(handle, "nvmlDeviceGetMaxMigDeviceCount")) else 0

    def _mig_devices(self, gpu: dict) -> list[tuple[int, int]]:
        return [(gi["id"], ci["id"]) for gi in gpu["instances"] for ci in gi["cis"]]

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        gpu = self._mig_enabled(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        devices = self._mig_devices(gpu)
        if index >= len(devices):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", handle[1], *devices[index])

    def nvmlDeviceGetAttributes(self, handle):
        fn = "nvmlDeviceGetAttributes"
        if handle[0] != "mig":  # "This API currently only supports MIG device handles."
            self._gpu(handle, fn)
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        gpu, instance, ci = self._mig(handle, fn)
        profile = _profile(gpu, instance["profile"])
        decoders, encoders, jpegs, ofas = profile[7]
        return _ns(
            gpuInstanceSliceCount=profile[2],
            computeInstanceSliceCount=ci["slices"] or profile[2],
            memorySizeMB=profile[3],
            multiprocessorCount=14 * (ci["slices"] or profile[2]),
            sharedCopyEngineCount=profile[2],
            sharedDecoderCount=decoders,
            sharedEncoderCount=encoders,
            sharedJpegCount=jpegs,
            sharedOfaCount=ofas,
        )

    def nvmlDeviceGetGpuInstanceId(self, handle):
        if handle[0] != "mig":
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._mig(handle, "nvmlDeviceGetGpuInstanceId")[1]["id"]

    def nvmlDeviceGetComputeInstanceId(self, handle):
        if handle[0] != "mig":
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._mig(handle, "nvmlDeviceGetComputeInstanceId")[2]["id"]

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle, kind, version=2):
        gpu = self._mig_enabled(handle, "nvmlDeviceGetGpuInstanceProfileInfo")
        if kind >= pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for name, pid, slices, memory, count, _starts, _size, engines, label in _profiles(gpu):
            if getattr(pynvml, f"NVML_GPU_INSTANCE_PROFILE_{name}") == kind:
                info = _ns(
                    id=pid,
                    sliceCount=slices,
                    instanceCount=count,
                    memorySizeMB=memory,
                    decoderCount=engines[0],
                    encoderCount=engines[1],
                    jpegCount=engines[2],
                    ofaCount=engines[3],
                )
                if version == 2:
                    info.name = f"MIG {label}".encode()
                return info
        raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _by_id(self, gpu: dict, profile_id: int) -> tuple:
        for profile in _profiles(gpu):
            if profile[1] == profile_id:
                return profile
        raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetGpuInstances(self, handle, profile_id, found, count_ref):
        gpu = self._mig_enabled(handle, "nvmlDeviceGetGpuInstances")
        label = self._by_id(gpu, profile_id)[8]
        mine = [gi for gi in gpu["instances"] if gi["profile"] == label]
        assert len(found) >= len(mine), "the buffer must hold the profile's instance count"
        for n, instance in enumerate(mine):
            found[n] = ("gi", handle[1], instance["id"])
        count_ref._obj.value = len(mine)

    def nvmlDeviceGetGpuInstanceById(self, handle, gi_id):
        gpu = self._mig_enabled(handle, "nvmlDeviceGetGpuInstanceById")
        self._gi(gpu, gi_id)
        return ("gi", handle[1], gi_id)

    def nvmlGpuInstanceGetInfo(self, gi):
        gpu = self._gpu(gi, "nvmlGpuInstanceGetInfo")
        instance = self._gi(gpu, gi[2], pynvml.NVML_ERROR_INVALID_ARGUMENT)
        profile = _profile(gpu, instance["profile"])
        placement = _ns(start=instance["start"], size=profile[6])
        return _ns(id=instance["id"], profileId=profile[1], placement=placement)

    def nvmlGpuInstanceGetComputeInstanceById(self, gi, ci_id):
        gpu = self._gpu(gi, "nvmlGpuInstanceGetComputeInstanceById")
        self._ci(self._gi(gpu, gi[2], pynvml.NVML_ERROR_INVALID_ARGUMENT), ci_id)
        return ("ci", gi[1], gi[2], ci_id)

    # MIG: changing

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle, profile_id, placement_ref):
        gpu = self._mig_enabled(handle, "nvmlDeviceCreateGpuInstanceWithPlacement")
        profile = self._by_id(gpu, profile_id)
        placement = placement_ref._obj
        if placement.start not in profile[5] or placement.size != profile[6]:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for other in gpu["instances"]:
            start, size = other["start"], _profile(gpu, other["profile"])[6]
            if placement.start < start + size and start < placement.start + placement.size:
                raise _error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = 1 + max((gi["id"] for gi in gpu["instances"]), default=0)
        gpu["instances"].append(gpu_instance(gi_id, profile[8], placement.start))
        return ("gi", handle[1], gi_id)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi, profile, engine, version=2):
        assert engine == pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        gpu = self._gpu(gi, "nvmlGpuInstanceGetComputeInstanceProfileInfo")
        instance = self._gi(gpu, gi[2], pynvml.NVML_ERROR_INVALID_ARGUMENT)
        slices = CI_SLICES.get(profile)
        if slices is None or slices > _profile(gpu, instance["profile"])[2]:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _ns(id=profile, sliceCount=slices)

    def nvmlGpuInstanceCreateComputeInstance(self, gi, ci_profile):
        gpu = self._gpu(gi, "nvmlGpuInstanceCreateComputeInstance")
        instance = self._gi(gpu, gi[2], pynvml.NVML_ERROR_INVALID_ARGUMENT)
        whole = _profile(gpu, instance["profile"])[2]
        taken = sum(ci["slices"] or whole for ci in instance["cis"])
        slices = CI_SLICES[ci_profile]
        if taken + slices > whole:
            raise _error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = 1 + max((ci["id"] for ci in instance["cis"]), default=-1)
        uuid = f"MIG-created-{gi[1]}-{gi[2]}-{ci_id}"
        own = None if slices == whole else slices
        ci = compute_instance(uuid, ci_id, own, ci_profile=ci_profile)
        instance["cis"].append(ci)
        return ("ci", gi[1], gi[2], ci_id)

    def nvmlComputeInstanceDestroy(self, ci):
        gpu = self._gpu(ci, "nvmlComputeInstanceDestroy")
        invalid = pynvml.NVML_ERROR_INVALID_ARGUMENT
        instance = self._gi(gpu, ci[2], invalid)
        compute = self._ci(instance, ci[3], invalid)
        if compute["processes"]:
            raise _error(pynvml.NVML_ERROR_IN_USE)
        instance["cis"].remove(compute)

    def nvmlGpuInstanceDestroy(self, gi):
        gpu = self._gpu(gi, "nvmlGpuInstanceDestroy")
        instance = self._gi(gpu, gi[2], pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if instance["cis"]:
            raise _error(pynvml.NVML_ERROR_IN_USE)
        gpu["instances"].remove(instance)
