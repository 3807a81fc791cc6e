"""Real GPUs read through NVML (pynvml).

Read-only: it never changes a GPU setting. Only with `manage_mig` (the operator's
--manage-mig) does it create and destroy MIG GPU instances, and only for allocations.
An NVML error never escapes: a field NVML cannot give is null, a GPU that fails is
reported unhealthy with the reason.
"""

import ctypes
import logging
import os
import time

import pynvml

from agent.allocations import Allocation
from agent.errors import conflict
from agent.mig import MigProfile, profile_by_shape
from agent.models import mig_profiles, model_key
from agent.samples import make_sample, mig_view, shared_view, whole_view

log = logging.getLogger(__name__)

MIB = 1024 * 1024

# GPU instance profile of each MIG shape (compute slices, memory slots)
GI_PROFILES = {
    (1, 1): pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
    (1, 2): pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
    (2, 2): pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    (3, 4): pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
    (4, 4): pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
    (7, 8): pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
}
# compute instance profile that takes a whole GPU instance of that many compute slices
CI_PROFILES = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
}


def _gpu_failed(exc: pynvml.NVMLError) -> bool:
    """Whether an NVML error means the GPU itself is unusable, not just one value missing."""
    return exc.value in (
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_UNKNOWN,
    )


def _optional(fn, *args):
    """fn(*args), or None when NVML cannot give that value (not supported, no permission…);
    errors that mean the GPU failed propagate."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        if _gpu_failed(exc):
            raise
        return None


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _processes(handle) -> list[dict]:
    procs = _optional(pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
    return [
        {
            "pid": proc.pid,
            "used_mib": proc.usedGpuMemory // MIB if proc.usedGpuMemory is not None else None,
        }
        for proc in procs
    ]


class NvmlBackend:
    name = "nvml"

    def __init__(self, modes: list[str] | None, manage_mig: bool):
        pynvml.nvmlInit()
        self.count = pynvml.nvmlDeviceGetCount()
        modes = modes or ["whole"]
        if len(modes) not in (1, self.count):
            raise ValueError(f"{len(modes)} modes given for {self.count} GPUs")
        self._modes = modes * self.count if len(modes) == 1 else list(modes)
        self.manage_mig = manage_mig
        self.driver_version = _text(_optional(pynvml.nvmlSystemGetDriverVersion))
        cuda = _optional(pynvml.nvmlSystemGetCudaDriverVersion)
        self.cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None
        self._known: dict[int, dict] = {}  # last identity read of each GPU, kept if it fails
        self._errors: dict[int, int] = {}  # NVML error code of each GPU that failed
        self._util_ts: dict[int, int] = {}  # newest per-process utilization timestamp seen

    def _failed(self, index: int, exc: pynvml.NVMLError) -> str:
        """Note a GPU's failure (logged once, not on every read); answer its health reason."""
        if self._errors.get(index) != exc.value:
            log.error("GPU %d failed: NVML: %s", index, exc)
        self._errors[index] = exc.value
        lost = exc.value == pynvml.NVML_ERROR_GPU_IS_LOST
        return f"gpu_lost: {exc}" if lost else f"nvml_error: {exc}"

    def _recovered(self, index: int) -> None:
        if self._errors.pop(index, None) is not None:
            log.warning("GPU %d answers NVML again", index)

    def _mode(self, index: int, mig_enabled: bool) -> str:
        """A GPU with MIG enabled is in mig mode; else in the mode the operator chose for it,
        whole or shared (MIG asked for but not enabled: whole)."""
        if mig_enabled:
            return "mig"
        return "shared" if self._modes[index] == "shared" else "whole"

    def set_mode(self, index: int, mode: str) -> None:
        """Choose whole or shared for a GPU without MIG; MIG mode itself is never changed."""
        try:
            mig_enabled = self._mig_mode(pynvml.nvmlDeviceGetHandleByIndex(index))[0]
        except pynvml.NVMLError as exc:
            raise conflict("gpu_unhealthy", f"GPU {index}: NVML: {exc}") from exc
        if (mode == "mig") != mig_enabled:
            state, flag = ("enabled", 0) if mig_enabled else ("disabled", 1)
            raise conflict(
                "mode_unsupported",
                f"GPU {index} has MIG {state} and the agent never changes MIG mode; "
                f"the operator can (nvidia-smi -i {index} -mig {flag}, then reset the GPU)",
            )
        self._modes[index] = mode

    def gpus(self) -> list[dict]:
        return [self._inventory(index) for index in range(self.count)]

    def _identity(self, handle) -> dict:
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        name = _text(_optional(pynvml.nvmlDeviceGetName, handle)) or "unknown"
        pci = _optional(pynvml.nvmlDeviceGetPciInfo, handle)
        memory = _optional(pynvml.nvmlDeviceGetMemoryInfo, handle)
        memory_mib = memory.total // MIB if memory else None
        return {
            "uuid": uuid,
            "name": name,
            "model": model_key(name, memory_mib),
            "pci_bus_id": _text(pci.busId) if pci else None,
            "memory_mib": memory_mib,
        }

    def _inventory(self, index: int) -> dict:
        known = self._known.get(index, {})
        entry = {
            "index": index,
            "uuid": known.get("uuid"),
            "name": known.get("name"),
            "model": known.get("model"),
            "pci_bus_id": known.get("pci_bus_id"),
            "memory_mib": known.get("memory_mib"),
            "mode": self._mode(index, False),
            "mig_enabled": False,
            "mig_pending": None,
            "healthy": False,
            "health_reason": None,
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "mig_devices": [],
        }
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            identity = self._identity(handle)
            self._known[index] = identity
            current, pending = self._mig_mode(handle)
            devices = self._mig_devices(handle, identity["model"]) if current else []
            ecc = self._ecc(handle)
            entry.update(
                identity,
                mode=self._mode(index, current),
                mig_enabled=current,
                mig_pending=pending,
                healthy=not ecc,
                health_reason=f"ecc: {ecc} volatile uncorrected ECC errors" if ecc else None,
                mig_devices=[device for device, _ in devices],
            )
            self._recovered(index)
        except pynvml.NVMLError as exc:
            entry["health_reason"] = self._failed(index, exc)
        return entry

    def _ecc(self, handle) -> int | None:
        return _optional(
            pynvml.nvmlDeviceGetTotalEccErrors,
            handle,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )

    def _mig_mode(self, handle) -> tuple[bool, bool | None]:
        modes = _optional(pynvml.nvmlDeviceGetMigMode, handle)
        if modes is None:
            return False, None
        enabled = pynvml.NVML_DEVICE_MIG_ENABLE
        return modes[0] == enabled, modes[1] == enabled

    def _mig_handles(self, handle) -> list:
        count = _optional(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        handles = [
            _optional(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, i) for i in range(count)
        ]
        return [mig for mig in handles if mig is not None]

    def _mig_devices(self, handle, model: str) -> list[tuple[dict, object]]:
        """(inventory entry, NVML handle) of each MIG device of a GPU."""
        profiles = mig_profiles(model)
        devices = []
        for mig in self._mig_handles(handle):
            memory = _optional(pynvml.nvmlDeviceGetMemoryInfo, mig)
            attrs = _optional(pynvml.nvmlDeviceGetAttributes, mig)
            placement = self._placement(handle, mig)
            start, size = (placement.start, placement.size) if placement else (None, None)
            compute = attrs.gpuInstanceSliceCount if attrs else None
            profile = profile_by_shape(profiles, compute, size)
            if profile:
                name = profile.name
            elif attrs:
                name = f"{compute}g.{round(attrs.memorySizeMB / 1024)}gb"
            else:
                name = None
            entry = {
                "uuid": _text(pynvml.nvmlDeviceGetUUID(mig)),
                "profile": name,
                "start": start,
                "size": size,
                "memory_mib": memory.total // MIB if memory else None,
            }
            devices.append((entry, mig))
        return devices

    def _placement(self, handle, mig):
        gi_id = _optional(pynvml.nvmlDeviceGetGpuInstanceId, mig)
        gi = (
            _optional(pynvml.nvmlDeviceGetGpuInstanceById, handle, gi_id)
            if gi_id is not None
            else None
        )
        info = _optional(pynvml.nvmlGpuInstanceGetInfo, gi) if gi is not None else None
        return info.placement if info else None

    def lost_gpus(self) -> set[int]:
        lost = pynvml.NVML_ERROR_GPU_IS_LOST
        return {index for index, code in self._errors.items() if code == lost}

    def ensure_mig(self, index: int, profile: MigProfile, start: int) -> str:
        """The UUID of the MIG device at that placement; created only with --manage-mig."""
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for device, _ in self._mig_devices(handle, self._identity(handle)["model"]):
                if device["profile"] == profile.name and device["start"] == start:
                    return device["uuid"]
            if not self.manage_mig:
                raise conflict(
                    "mig_device_missing",
                    f"GPU {index} has no {profile.name} MIG device at slot {start}; create it, "
                    "or run the agent with --manage-mig",
                )
            return self._create_mig(handle, profile, start)
        except pynvml.NVMLError as exc:
            raise conflict(
                "mig_error", f"NVML failed on {profile.name} at slot {start} of GPU {index}: {exc}"
            ) from exc

    def _create_mig(self, handle, profile: MigProfile, start: int) -> str:
        info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(
            handle, GI_PROFILES[(profile.compute, profile.size)]
        )
        placement = pynvml.c_nvmlGpuInstancePlacement_t(start, profile.size)
        gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            handle, info.id, ctypes.byref(placement)
        )
        try:
            ci_info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi,
                CI_PROFILES[profile.compute],
                pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
        except pynvml.NVMLError:
            pynvml.nvmlGpuInstanceDestroy(gi)
            raise
        gi_id = pynvml.nvmlGpuInstanceGetInfo(gi).id
        for mig in self._mig_handles(handle):
            if pynvml.nvmlDeviceGetGpuInstanceId(mig) == gi_id:
                log.info("created MIG %s at slot %d", profile.name, start)
                return _text(pynvml.nvmlDeviceGetUUID(mig))
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def release_mig(self, index: int, mig_uuid: str) -> None:
        """Destroy an allocation's MIG device, with --manage-mig; else leave it to the operator."""
        if not self.manage_mig:
            return
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for mig in self._mig_handles(handle):
                if _text(pynvml.nvmlDeviceGetUUID(mig)) != mig_uuid:
                    continue
                gi = pynvml.nvmlDeviceGetGpuInstanceById(
                    handle, pynvml.nvmlDeviceGetGpuInstanceId(mig)
                )
                ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(
                    gi, pynvml.nvmlDeviceGetComputeInstanceId(mig)
                )
                pynvml.nvmlComputeInstanceDestroy(ci)
                pynvml.nvmlGpuInstanceDestroy(gi)
                log.info("destroyed MIG device %s on GPU %d", mig_uuid, index)
        except pynvml.NVMLError as exc:
            log.warning("GPU %d: could not destroy MIG device %s: %s", index, mig_uuid, exc)

    def sample(self, allocations: list[Allocation]) -> list[dict]:
        running = [a for a in allocations if a.state == "running"]
        samples, gpu_samples = [], {}
        for index in range(self.count):
            gpu_sample, mig_samples, proc_util = self._read(index)
            gpu_samples[index] = gpu_sample
            samples.append(gpu_sample)
            samples.extend(mig_samples.values())
            for alloc in running:
                if index not in alloc.gpus:
                    continue
                if alloc.mode == "mig" and alloc.mig_uuid in mig_samples:
                    samples.append(mig_view(alloc, mig_samples[alloc.mig_uuid]))
                elif alloc.mode == "shared":
                    samples.append(self._shared_sample(alloc, gpu_sample, proc_util))
        for alloc in running:
            if alloc.mode == "whole":
                samples.append(whole_view(alloc, [gpu_samples[i] for i in alloc.gpus]))
        return samples

    def _read(self, index: int) -> tuple[dict, dict[str, dict], dict[int, float] | None]:
        """A GPU's sample, its MIG devices' samples, and its per-process SM utilization
        (None when NVML cannot give it)."""
        ts = time.time()
        uuid = self._known.get(index, {}).get("uuid")
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            util = _optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
            memory = _optional(pynvml.nvmlDeviceGetMemoryInfo, handle)
            power_mw = _optional(pynvml.nvmlDeviceGetPowerUsage, handle)
            ecc = self._ecc(handle)
            gpu = make_sample(
                ts,
                "gpu",
                index,
                uuid,
                gpu_util=util.gpu if util else None,
                mem_used_mib=memory.used // MIB if memory else None,
                mem_total_mib=memory.total // MIB if memory else None,
                temperature_c=_optional(
                    pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU
                ),
                power_w=round(power_mw / 1000, 1) if power_mw is not None else None,
                sm_clock_mhz=_optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
                ecc_errors=ecc,
                healthy=not ecc,
                processes=_processes(handle),
            )
            migs = {}
            if self._mig_mode(handle)[0]:
                for device, mig in self._mig_devices(
                    handle, self._known.get(index, {}).get("model")
                ):
                    migs[device["uuid"]] = make_sample(
                        ts,
                        "mig",
                        index,
                        uuid,
                        mig_uuid=device["uuid"],
                        mem_used_mib=self._mig_used(mig),
                        mem_total_mib=device["memory_mib"],
                        ecc_errors=ecc,
                        healthy=not ecc,
                        processes=_processes(mig),
                    )
            proc_util = self._process_util(index, handle)
            self._recovered(index)
            return gpu, migs, proc_util
        except pynvml.NVMLError as exc:
            self._failed(index, exc)
            return make_sample(ts, "gpu", index, uuid, healthy=False), {}, None

    def _mig_used(self, mig) -> int | None:
        memory = _optional(pynvml.nvmlDeviceGetMemoryInfo, mig)
        return memory.used // MIB if memory else None

    def _process_util(self, index: int, handle) -> dict[int, float] | None:
        last = self._util_ts.get(index, 0)
        try:
            rows = pynvml.nvmlDeviceGetProcessUtilization(handle, last)
        except pynvml.NVMLError as exc:
            if _gpu_failed(exc):
                raise
            # NOT_FOUND: no process used the GPU since `last`
            return {} if exc.value == pynvml.NVML_ERROR_NOT_FOUND else None
        self._util_ts[index] = max((row.timeStamp for row in rows), default=last)
        util: dict[int, float] = {}
        for row in rows:
            util[row.pid] = max(util.get(row.pid, 0), row.smUtil)
        return util

    def _shared_sample(
        self, alloc: Allocation, gpu_sample: dict, proc_util: dict[int, float] | None
    ) -> dict:
        """A shared allocation's view: the GPU processes in its workload's session."""
        mine = [p for p in gpu_sample["processes"] if alloc.pid and _session(p["pid"]) == alloc.pid]
        used = [p["used_mib"] for p in mine]
        readable = gpu_sample["mem_used_mib"] is not None and None not in used
        mem = sum(used) if readable else None
        util = None
        if proc_util is not None:
            busy = sum(proc_util.get(p["pid"], 0) for p in mine)
            util = round(min(100.0, busy * 1000 / alloc.spec["shared"]["milli"]), 1)
        return shared_view(alloc, gpu_sample, util, mem, mine)
