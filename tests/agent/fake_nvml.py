"""A stand-in for the pynvml module: GPUs described by dicts, pynvml's own constants and
error classes, and every call recorded.

A GPU dict holds uuid, name, bus_id, total/used (bytes), util, temp, power_mw, sm, ecc,
mig ((current, pending) or None when MIG is not supported), mig_devices, processes
([(pid, used bytes)]), proc_util ([(pid, sm util)]), errors ({function name: NVML error
code}) and lost (every call on it fails with NVML_ERROR_GPU_IS_LOST).
"""

import types

import pynvml

MIB = 1024 * 1024
# GPU instance profile -> compute slices, for the profiles the agent creates
GI_SLICES = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: 1,
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: 1,
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: 2,
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: 3,
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: 4,
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: 7,
}
GI_PROFILE_ID_BASE = 100


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
        "mig_devices": [],
        "processes": [],
        "proc_util": [],
        "errors": {},
        "lost": False,
        **fields,
    }


def mig_device(uuid: str, gi: int, start: int, size: int, slices: int, total_mib: int, **more):
    return {
        "uuid": uuid,
        "gi": gi,
        "ci": 0,
        "start": start,
        "size": size,
        "slices": slices,
        "total": total_mib * MIB,
        "used": 0,
        "processes": [],
        **more,
    }


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _ns(**fields) -> types.SimpleNamespace:
    return types.SimpleNamespace(**fields)


class FakeNvml:
    def __init__(self, gpus: list[dict]):
        self.gpus = gpus
        self.calls: list[str] = []
        self.module = types.ModuleType("pynvml")
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError", "c_nvml")):
                setattr(self.module, name, getattr(pynvml, name))
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(self.module, name, self._recorded(name, getattr(self, name)))

    def _recorded(self, name, fn):
        def call(*args):
            self.calls.append(name)
            return fn(*args)

        return call

    def mutating_calls(self) -> list[str]:
        verbs = ("Set", "Create", "Destroy", "Reset", "Clear")
        return [name for name in self.calls if any(verb in name for verb in verbs)]

    def _gpu(self, handle, fn: str) -> dict:
        gpu = self.gpus[handle[1]]
        if gpu["lost"]:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in gpu["errors"]:
            raise _error(gpu["errors"][fn])
        return gpu

    def _device(self, handle, fn: str) -> dict:
        """The GPU dict, or the MIG device dict, a device handle stands for."""
        gpu = self._gpu(handle, fn)
        return gpu["mig_devices"][handle[2]] if handle[0] == "mig" else gpu

    # system

    def nvmlInit(self):
        return None

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    # identity

    def nvmlDeviceGetHandleByIndex(self, index):
        handle = ("gpu", index)
        self._gpu(handle, "nvmlDeviceGetHandleByIndex")
        return handle

    def nvmlDeviceGetUUID(self, handle):
        return self._device(handle, "nvmlDeviceGetUUID")["uuid"]

    def nvmlDeviceGetName(self, handle):
        return self._gpu(handle, "nvmlDeviceGetName")["name"]

    def nvmlDeviceGetPciInfo(self, handle):
        return _ns(busId=self._gpu(handle, "nvmlDeviceGetPciInfo")["bus_id"].encode())

    def nvmlDeviceGetMemoryInfo(self, handle):
        device = self._device(handle, "nvmlDeviceGetMemoryInfo")
        return _ns(
            total=device["total"], used=device["used"], free=device["total"] - device["used"]
        )

    # metrics

    def nvmlDeviceGetUtilizationRates(self, handle):
        if handle[0] == "mig":
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _ns(gpu=self._gpu(handle, "nvmlDeviceGetUtilizationRates")["util"], memory=0)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu(handle, "nvmlDeviceGetTemperature")["temp"]

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._gpu(handle, "nvmlDeviceGetPowerUsage")["power_mw"]

    def nvmlDeviceGetClockInfo(self, handle, clock):
        assert clock == pynvml.NVML_CLOCK_SM
        return self._gpu(handle, "nvmlDeviceGetClockInfo")["sm"]

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter):
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        assert counter == pynvml.NVML_VOLATILE_ECC
        return self._gpu(handle, "nvmlDeviceGetTotalEccErrors")["ecc"]

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        device = self._device(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [_ns(pid=pid, usedGpuMemory=used) for pid, used in device["processes"]]

    def nvmlDeviceGetProcessUtilization(self, handle, last_seen):
        rows = self._gpu(handle, "nvmlDeviceGetProcessUtilization")["proc_util"]
        if not rows:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return [_ns(pid=pid, smUtil=sm, timeStamp=last_seen + 1) for pid, sm in rows]

    # MIG

    def nvmlDeviceGetMigMode(self, handle):
        mig = self._gpu(handle, "nvmlDeviceGetMigMode")["mig"]
        if mig is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(mig)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return 7 if self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount")["mig"] else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        devices = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")["mig_devices"]
        if index >= len(devices):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", handle[1], index)

    def nvmlDeviceGetAttributes(self, handle):
        device = self._device(handle, "nvmlDeviceGetAttributes")
        return _ns(gpuInstanceSliceCount=device["slices"], memorySizeMB=device["total"] // MIB)

    def nvmlDeviceGetGpuInstanceId(self, handle):
        return self._device(handle, "nvmlDeviceGetGpuInstanceId")["gi"]

    def nvmlDeviceGetComputeInstanceId(self, handle):
        return self._device(handle, "nvmlDeviceGetComputeInstanceId")["ci"]

    def _instance(self, gpu: dict, gi_id: int) -> dict:
        for device in gpu["mig_devices"]:
            if device["gi"] == gi_id:
                return device
        raise _error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetGpuInstanceById(self, handle, gi_id):
        self._instance(self._gpu(handle, "nvmlDeviceGetGpuInstanceById"), gi_id)
        return ("gi", handle[1], gi_id)

    def nvmlGpuInstanceGetInfo(self, gi):
        device = self._instance(self._gpu(gi, "nvmlGpuInstanceGetInfo"), gi[2])
        return _ns(id=gi[2], placement=_ns(start=device["start"], size=device["size"]))

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle, profile):
        return _ns(id=GI_PROFILE_ID_BASE + profile)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle, profile_id, placement_ref):
        gpu = self._gpu(handle, "nvmlDeviceCreateGpuInstanceWithPlacement")
        placement = placement_ref._obj
        gi_id = 1 + max((d["gi"] for d in gpu["mig_devices"]), default=0)
        slices = GI_SLICES[profile_id - GI_PROFILE_ID_BASE]
        device = mig_device(
            f"MIG-created-{gi_id}", gi_id, placement.start, placement.size, slices, 9728
        )
        gpu["mig_devices"].append({**device, "ci": None})
        return ("gi", handle[1], gi_id)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi, profile, engine):
        assert engine == pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        return _ns(id=profile)

    def nvmlGpuInstanceCreateComputeInstance(self, gi, ci_profile):
        device = self._instance(self._gpu(gi, "nvmlGpuInstanceCreateComputeInstance"), gi[2])
        device["ci"] = 0
        device["ci_profile"] = ci_profile
        return ("ci", gi[1], gi[2], 0)

    def nvmlGpuInstanceGetComputeInstanceById(self, gi, ci_id):
        return ("ci", gi[1], gi[2], ci_id)

    def nvmlComputeInstanceDestroy(self, ci):
        self._instance(self._gpu(ci, "nvmlComputeInstanceDestroy"), ci[2])["ci"] = None

    def nvmlGpuInstanceDestroy(self, gi):
        gpu = self._gpu(gi, "nvmlGpuInstanceDestroy")
        gpu["mig_devices"].remove(self._instance(gpu, gi[2]))
