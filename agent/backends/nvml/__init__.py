"""Real GPUs read through NVML (pynvml).

Read-only: it never changes a GPU setting. Only with `manage_mig` (the operator's
--manage-mig) does it create and destroy MIG instances, and only for allocations.

Errors: only GPU_IS_LOST, RESET_REQUIRED, UNINITIALIZED and DRIVER_NOT_LOADED mean a GPU
failed (it is reported unhealthy with the reason); any other NVML error nulls the one value it
was reading, and a MIG device whose UUID cannot be read is left out. Every NVML call runs on a
worker thread (`worker` here): a hung driver makes the GPUs unhealthy ("nvml_hung") instead
of stalling the agent's API and heartbeats.

MIG follows nvml.h: reading a MIG device's placement and listing GPU instances need MIG
privileges (root, CAP_SYS_ADMIN or the mig/monitor capability), and so does the memory of a
MIG-enabled GPU. Without them the model is recognised by name, MIG devices are named from their
GPU instance profile (or NVIDIA's memory rule) and matched to allocations by slice count and
memory; the agent says what is missing when it starts, and refuses --manage-mig. A GPU instance
left without a compute instance (an orphan: it holds its slots, no workload can use it) is
listed in the GPU's `mig_devices` with `"uuid": null` and `"orphan"`. MIG utilization comes
from DCGM where it runs (`dcgm` here); temperature, power and SM clock are the GPU's.
"""

import ctypes
import logging
import os
import time
from dataclasses import dataclass

import pynvml

from agent.allocations import Allocation
from agent.backends.nvml import dcgm
from agent.backends.nvml.access import GRANT_HINT, mig_access
from agent.backends.nvml.names import (
    CI_PROFILES,
    CREATE,
    GiProfile,
    Shape,
    match_profile,
    profile_name,
)
from agent.backends.nvml.names import shape as mig_shape
from agent.backends.nvml.worker import NvmlHung, Worker
from agent.errors import ApiError, conflict
from agent.gpu_models import MODELS, model_key
from agent.mig import MigProfile, overlaps
from agent.samples import make_sample, mig_view, shared_view, whole_view

log = logging.getLogger(__name__)

MIB = 1024 * 1024
TIMEOUT_SECONDS = 5.0  # one pass of readings over every GPU
CHANGE_TIMEOUT_SECONDS = 30.0  # creating or destroying a MIG device
RELEASE_TRIES = 3  # a compute instance is IN_USE for a moment after its processes exit
RELEASE_PAUSE_SECONDS = 0.5
# the only errors that mean the GPU itself failed (nvml.h); any other nulls one value
FAILED = frozenset(
    {
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    }
)
AUTO = object()  # dcgm: connect to DCGM's host engine once a GPU has MIG enabled


def _gpu_failed(exc: pynvml.NVMLError) -> bool:
    """Whether an NVML error means the GPU itself is unusable, not just one value missing."""
    return exc.value in FAILED


def _outcome(exc: pynvml.NVMLError) -> str:
    if exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
        return "unsupported"
    if exc.value == pynvml.NVML_ERROR_NO_PERMISSION:
        return "no permission"
    return f"error: {exc}"


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


class Reads:
    """The optional readings of one pass over a GPU: each NVML call's value, or None, with
    what it gave (ok, unsupported, no permission, or the error) kept by call name for the
    probe. Errors that mean the GPU failed propagate."""

    def __init__(self):
        self.outcomes: dict[str, str] = {}

    def note(self, key: str, exc: pynvml.NVMLError | None) -> None:
        if exc is None:
            self.outcomes.setdefault(key, "ok")
        else:
            self.outcomes[key] = _outcome(exc)

    def get(self, fn, *args, scope: str = "", key: str | None = None):
        key = scope + (key or fn.__name__)
        try:
            value = fn(*args)
        except pynvml.NVMLError as exc:
            if _gpu_failed(exc):
                raise
            self.note(key, exc)
            return None
        self.note(key, None)
        return value

    def refused(self) -> list[str]:
        return [key for key, outcome in self.outcomes.items() if outcome == "no permission"]


@dataclass
class MigDevice:
    """A MIG device (a compute instance) of a GPU, or an orphan GPU instance (no compute
    instance: no UUID, no handle)."""

    uuid: str | None
    handle: object
    gi_id: int | None
    ci_id: int | None
    shape: Shape
    start: int | None
    size: int | None
    memory_mib: int | None
    used_mib: int | None = None
    ecc: int | None = None
    gi: object = None  # the GPU instance's handle, where it was read

    def fits(self, profile: MigProfile) -> bool:
        """Whether this device is a whole `profile` instance, wherever it starts."""
        return (
            self.shape.offered
            and self.shape.compute == profile.compute
            and self.size == profile.size
        )

    def entry(self) -> dict:
        entry = {
            "uuid": self.uuid,
            "profile": self.shape.name,
            "start": self.start,
            "size": self.size,
            "memory_mib": self.memory_mib,
            "gpu_instance_id": self.gi_id,
        }
        if self.uuid is None:
            entry["orphan"] = "GPU instance without a compute instance: it holds its slots"
        else:
            entry["compute_instance_id"] = self.ci_id
        return entry

    def where(self) -> str:
        at = f"at slot {self.start}" if self.start is not None else "at an unreadable slot"
        return f"{self.shape.name or 'MIG device'} {at} (GPU instance {self.gi_id})"


def _processes(handle, reads: Reads, scope: str = "") -> list[dict]:
    procs = reads.get(pynvml.nvmlDeviceGetComputeRunningProcesses, handle, scope=scope) or []
    return [
        {
            "pid": proc.pid,
            "used_mib": proc.usedGpuMemory // MIB if proc.usedGpuMemory is not None else None,
        }
        for proc in procs
    ]


def _temperature(handle, reads: Reads):
    """nvmlDeviceGetTemperatureV; the deprecated nvmlDeviceGetTemperature where the driver
    (or pynvml) has no V."""
    versioned = getattr(pynvml, "nvmlDeviceGetTemperatureV", None)
    if versioned is not None:
        try:
            value = versioned(handle, pynvml.NVML_TEMPERATURE_GPU)
        except pynvml.NVMLError as exc:
            old_driver = (
                pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
            )
            if _gpu_failed(exc):
                raise
            if exc.value not in old_driver:
                reads.note("nvmlDeviceGetTemperatureV", exc)
                return None
        else:
            reads.note("nvmlDeviceGetTemperatureV", None)
            return value
    return reads.get(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)


def _ecc(handle, reads: Reads, scope: str = "") -> int | None:
    return reads.get(
        pynvml.nvmlDeviceGetTotalEccErrors,
        handle,
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        pynvml.NVML_VOLATILE_ECC,
        scope=scope,
    )


def _sum(values: list) -> int | None:
    return sum(values) if values and None not in values else None


class NvmlBackend:
    name = "nvml"

    def __init__(
        self,
        modes: list[str] | None,
        manage_mig: bool,
        *,
        dcgm=AUTO,
        timeout: float = TIMEOUT_SECONDS,
        access=None,
    ):
        """`dcgm`: AUTO (DCGM's host engine where one runs), None (none), or a reader with
        `read()` -> {(GPU index, GPU instance id): utilization}. `access`: the process's MIG
        capabilities (`access.mig_access()` by default)."""
        pynvml.nvmlInit()
        self.count = pynvml.nvmlDeviceGetCount()
        modes = modes or ["whole"]
        if len(modes) not in (1, self.count):
            raise ValueError(f"{len(modes)} modes given for {self.count} GPUs")
        self._modes = modes * self.count if len(modes) == 1 else list(modes)
        self.manage_mig = manage_mig
        self.timeout = timeout
        self.change_timeout = max(timeout, CHANGE_TIMEOUT_SECONDS)
        self.release_pause = RELEASE_PAUSE_SECONDS
        self.driver_version = _text(Reads().get(pynvml.nvmlSystemGetDriverVersion))
        cuda = Reads().get(pynvml.nvmlSystemGetCudaDriverVersion)
        self.cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None
        self._known: dict[int, dict] = {}  # last identity read of each GPU, kept if it fails
        self._errors: dict[int, int] = {}  # NVML error code of each GPU that failed
        self._util_ts: dict[int, int] = {}  # newest per-process utilization timestamp seen
        self._profiles: dict[int, list[GiProfile]] = {}  # GPU instance profiles, while MIG is on
        self._given: dict[str, tuple[int, int]] = {}  # MIG UUID -> (GPU, start) of allocations
        self._instances: dict[str, tuple[int, int]] = {}  # MIG UUID -> (GPU, GPU instance id)
        self._noted: set[tuple] = set()  # things logged once
        self.readings: dict[int, dict[str, str]] = {}  # what each NVML reading gave, per GPU
        self._dcgm = dcgm
        self.dcgm_status = "DCGM: not used" if dcgm is None else None
        self.access = access if access is not None else mig_access()
        self.mig_gpus: set[int] = set()
        self.mig_refused = self._check_mig_privileges()
        self._worker = Worker()

    # --- start-up: MIG privileges ---------------------------------------------------------

    def _check_mig_privileges(self) -> dict[int, list[str]]:
        """{GPU index: the MIG readings NVML refuses for lack of privilege} of every
        MIG-enabled GPU; logs what is missing; refuses --manage-mig without them."""
        refused = {}
        for index in range(self.count):
            reads = Reads()
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                if not self._mig_mode(handle, reads)[0]:
                    continue
                self.mig_gpus.add(index)
                reads.get(pynvml.nvmlDeviceGetMemoryInfo, handle)
                profiles = self._gi_profiles(index, handle, reads)
                if profiles:
                    reads.get(
                        self._gpu_instances, handle, profiles[0], key="nvmlDeviceGetGpuInstances"
                    )
            except pynvml.NVMLError as exc:
                log.warning("GPU %d cannot be read at start: NVML: %s", index, exc)
                continue
            finally:
                self.readings[index] = dict(reads.outcomes)
            if reads.refused():
                refused[index] = reads.refused()
                log.warning(
                    "GPU %d has MIG enabled, but NVML refuses %s to this process (%s): the "
                    "start slot of its MIG devices cannot be read and GPU instances left "
                    "without a compute instance cannot be found; MIG devices are matched by "
                    "slice count and memory instead. To read everything: %s",
                    index,
                    ", ".join(refused[index]),
                    self.access.describe(),
                    GRANT_HINT,
                )
        if self.manage_mig and self.mig_gpus:
            missing = []
            if refused:
                gpus = ", ".join(str(index) for index in sorted(refused))
                missing.append(f"NVML refuses MIG readings on GPU {gpus}")
            if self.access.may("config") is False:
                missing.append("no mig/config capability")
            if missing:
                raise ValueError(
                    f"--manage-mig needs the privilege to create and destroy MIG instances "
                    f"({'; '.join(missing)}): {GRANT_HINT}; or run without --manage-mig"
                )
        return refused

    # --- health bookkeeping ---------------------------------------------------------------

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

    def _once(self, key: tuple, level: int, message: str, *args) -> None:
        if key not in self._noted:
            self._noted.add(key)
            log.log(level, message, *args)

    def lost_gpus(self) -> set[int]:
        lost = pynvml.NVML_ERROR_GPU_IS_LOST
        return {index for index, code in self._errors.items() if code == lost}

    # --- modes ----------------------------------------------------------------------------

    def _mode(self, index: int, mig_enabled: bool) -> str:
        """A GPU with MIG enabled is in mig mode; else in the mode the operator chose for it,
        whole or shared (MIG asked for but not enabled: whole)."""
        if mig_enabled:
            return "mig"
        return "shared" if self._modes[index] == "shared" else "whole"

    def set_mode(self, index: int, mode: str) -> None:
        """Choose whole or shared for a GPU without MIG; MIG mode itself is never changed."""
        try:
            mig_enabled = self._worker.call(self.timeout, self._mig_enabled, index)
        except NvmlHung as exc:
            raise ApiError(503, "nvml_hung", f"GPU {index}: {exc}") from exc
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

    def _mig_enabled(self, index: int) -> bool:
        return self._mig_mode(pynvml.nvmlDeviceGetHandleByIndex(index), Reads())[0]

    def _mig_mode(self, handle, reads: Reads) -> tuple[bool, bool | None]:
        modes = reads.get(pynvml.nvmlDeviceGetMigMode, handle)
        if modes is None:
            return False, None
        enabled = pynvml.NVML_DEVICE_MIG_ENABLE
        return modes[0] == enabled, modes[1] == enabled

    # --- inventory ------------------------------------------------------------------------

    def gpus(self) -> list[dict]:
        try:
            return self._worker.call(self.timeout, self._gpus)
        except NvmlHung as exc:
            return [self._entry(index, f"nvml_hung: {exc}") for index in range(self.count)]

    def _gpus(self) -> list[dict]:
        return [self._inventory(index) for index in range(self.count)]

    def _entry(self, index: int, reason: str | None = None) -> dict:
        """A GPU's inventory entry as last known, unhealthy with `reason`."""
        known = self._known.get(index, {})
        return {
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
            "health_reason": reason,
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "mig_devices": [],
        }

    def _identity(self, index: int, handle, reads: Reads) -> dict:
        known = self._known.get(index, {})
        try:
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError as exc:
            if _gpu_failed(exc) or not known.get("uuid"):
                raise
            reads.note("nvmlDeviceGetUUID", exc)
            uuid = known["uuid"]
        name = _text(reads.get(pynvml.nvmlDeviceGetName, handle)) or known.get("name")
        pci = reads.get(pynvml.nvmlDeviceGetPciInfo, handle)
        memory = reads.get(pynvml.nvmlDeviceGetMemoryInfo, handle)
        return {
            "uuid": uuid,
            "name": name or "unknown",
            "pci_bus_id": _text(pci.busId) if pci else known.get("pci_bus_id"),
            "memory_mib": memory.total // MIB if memory else None,
        }

    def _model(self, index: int, handle, identity: dict, mig: bool, reads: Reads) -> str:
        """The catalog key; a MIG-enabled GPU whose memory is refused is known by its name and
        its full GPU instance's memory."""
        memory = identity["memory_mib"]
        if memory is None and mig:
            profiles = self._gi_profiles(index, handle, reads)
            memory = max((p.memory_mib for p in profiles), default=None)
        return model_key(identity["name"], memory)

    def _inventory(self, index: int) -> dict:
        entry = self._entry(index)
        reads = Reads()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            identity = self._identity(index, handle, reads)
            current, pending = self._mig_mode(handle, reads)
            if current:
                self.mig_gpus.add(index)
            else:
                self._profiles.pop(index, None)
            identity["model"] = self._model(index, handle, identity, current, reads)
            self._known[index] = identity
            devices = self._mig_devices(index, handle, reads, orphans=True) if current else []
            live = [device for device in devices if device.uuid is not None]
            ecc = _ecc(handle, reads)
            if ecc is None and live:  # MIG: volatile ECC only per MIG device (nvml.h)
                ecc = _sum([device.ecc for device in live])
            entry.update(
                identity,
                mode=self._mode(index, current),
                mig_enabled=current,
                mig_pending=pending,
                healthy=not ecc,
                health_reason=f"ecc: {ecc} volatile uncorrected ECC errors" if ecc else None,
                mig_devices=[device.entry() for device in devices],
            )
            self._recovered(index)
        except pynvml.NVMLError as exc:
            entry["health_reason"] = self._failed(index, exc)
        self.readings[index] = {**self.readings.get(index, {}), **reads.outcomes}
        return entry

    # --- MIG devices ----------------------------------------------------------------------

    def _profile_info(self, handle, kind: int):
        """nvmlDeviceGetGpuInstanceProfileInfoV (with the profile's name), or v1 on drivers
        without it."""
        try:
            return pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, kind)
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
            return pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, kind, 1)

    def _gi_profiles(self, index: int, handle, reads: Reads) -> list[GiProfile]:
        """The GPU instance profiles of a MIG-enabled GPU (immutable while MIG is on: kept once
        read in full)."""
        if index in self._profiles:
            return self._profiles[index]
        profiles, complete = [], True
        for kind in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self._profile_info(handle, kind)
            except pynvml.NVMLError as exc:
                if _gpu_failed(exc):
                    raise
                if exc.value == pynvml.NVML_ERROR_INVALID_ARGUMENT:
                    break  # past the last profile this driver knows
                if exc.value != pynvml.NVML_ERROR_NOT_SUPPORTED:
                    reads.note("nvmlDeviceGetGpuInstanceProfileInfo", exc)
                    complete = False
                continue
            reads.note("nvmlDeviceGetGpuInstanceProfileInfo", None)
            engines = (info.decoderCount, info.encoderCount, info.jpegCount, info.ofaCount)
            profiles.append(
                GiProfile(
                    kind=kind,
                    id=info.id,
                    slices=info.sliceCount,
                    memory_mib=info.memorySizeMB,
                    name=profile_name(getattr(info, "name", None)),
                    instance_count=info.instanceCount,
                    engines=engines,
                )
            )
        if complete:
            self._profiles[index] = profiles
        return profiles

    def _gpu_instances(self, handle, profile: GiProfile) -> list:
        """The GPU instances of one profile (needs MIG privileges)."""
        found = (pynvml.c_nvmlGpuInstance_t * max(profile.instance_count, 1))()
        count = ctypes.c_uint(0)
        pynvml.nvmlDeviceGetGpuInstances(handle, profile.id, found, ctypes.byref(count))
        return [found[n] for n in range(count.value)]

    def _total_mib(self, index: int) -> int | None:
        """The GPU's memory for NVIDIA's naming rule: read, or its catalog model's."""
        known = self._known.get(index, {})
        model = MODELS.get(known.get("model") or "")
        return known.get("memory_mib") or (model.memory_mib if model else None)

    def _mig_handles(self, index: int, handle, reads: Reads) -> list:
        count = reads.get(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        handles = []
        for n in range(count):
            try:
                handles.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, n))
            except pynvml.NVMLError as exc:
                if _gpu_failed(exc):
                    raise
                if exc.value != pynvml.NVML_ERROR_NOT_FOUND:  # NOT_FOUND: no device there
                    reads.note("nvmlDeviceGetMigDeviceHandleByIndex", exc)
        return handles

    def _mig_devices(self, index: int, handle, reads: Reads, orphans=False) -> list[MigDevice]:
        """The MIG devices of a MIG-enabled GPU, then (with `orphans`) its GPU instances that
        have no compute instance."""
        profiles = self._gi_profiles(index, handle, reads)
        total = self._total_mib(index)
        scope = "MIG device: "
        devices, gpu_instances, left_out = [], {}, set()
        for mig in self._mig_handles(index, handle, reads):
            try:
                uuid = _text(pynvml.nvmlDeviceGetUUID(mig))
            except pynvml.NVMLError as exc:
                if _gpu_failed(exc):
                    raise
                reads.note(scope + "nvmlDeviceGetUUID", exc)
                left_out.add(Reads().get(pynvml.nvmlDeviceGetGpuInstanceId, mig))  # not orphan
                self._once(
                    ("uuid", index, exc.value),
                    logging.WARNING,
                    "GPU %d: a MIG device is left out, its UUID cannot be read: NVML: %s",
                    index,
                    exc,
                )
                continue
            memory = reads.get(pynvml.nvmlDeviceGetMemoryInfo, mig, scope=scope)
            attrs = reads.get(pynvml.nvmlDeviceGetAttributes, mig, scope=scope)
            gi_id = reads.get(pynvml.nvmlDeviceGetGpuInstanceId, mig, scope=scope)
            ci_id = reads.get(pynvml.nvmlDeviceGetComputeInstanceId, mig, scope=scope)
            if gi_id is not None and gi_id not in gpu_instances:
                gi = reads.get(pynvml.nvmlDeviceGetGpuInstanceById, handle, gi_id)
                info = reads.get(pynvml.nvmlGpuInstanceGetInfo, gi) if gi is not None else None
                gpu_instances[gi_id] = (gi, info)
            gi, info = gpu_instances.get(gi_id, (None, None))
            memory_mib = memory.total // MIB if memory else None
            if info is not None:
                profile = next((p for p in profiles if p.id == info.profileId), None)
            elif attrs is not None:
                engines = (
                    attrs.sharedDecoderCount,
                    attrs.sharedEncoderCount,
                    attrs.sharedJpegCount,
                    attrs.sharedOfaCount,
                )
                profile = match_profile(
                    profiles, attrs.gpuInstanceSliceCount, attrs.memorySizeMB, engines
                )
            else:
                profile = None
            shape = mig_shape(
                attrs.gpuInstanceSliceCount if attrs else None,
                attrs.computeInstanceSliceCount if attrs else None,
                attrs.memorySizeMB if attrs else memory_mib,
                profile,
                total,
            )
            devices.append(
                MigDevice(
                    uuid=uuid,
                    handle=mig,
                    gi_id=gi_id,
                    ci_id=ci_id,
                    shape=shape,
                    start=info.placement.start if info else None,
                    size=info.placement.size if info else shape.slots,
                    memory_mib=memory_mib,
                    used_mib=memory.used // MIB if memory else None,
                    ecc=_ecc(mig, reads, scope),
                    gi=gi,
                )
            )
        if orphans:
            live = {d.gi_id for d in devices} | left_out
            devices += self._orphans(index, handle, profiles, live, reads)
        return devices

    def _orphans(
        self, index: int, handle, profiles: list[GiProfile], live: set, reads: Reads
    ) -> list[MigDevice]:
        """GPU instances without a compute instance: no MIG device handle shows them, but
        they hold their slots (needs MIG privileges to list)."""
        found = []
        total = self._total_mib(index)
        for profile in profiles:
            gis = reads.get(self._gpu_instances, handle, profile, key="nvmlDeviceGetGpuInstances")
            if gis is None:
                break  # refused or unsupported: the same for every profile
            for gi in gis:
                info = reads.get(pynvml.nvmlGpuInstanceGetInfo, gi)
                if info is None or info.id in live:
                    continue
                shape = mig_shape(profile.slices, None, profile.memory_mib, profile, total)
                orphan = MigDevice(
                    uuid=None,
                    handle=None,
                    gi_id=info.id,
                    ci_id=None,
                    shape=shape,
                    start=info.placement.start,
                    size=info.placement.size,
                    memory_mib=profile.memory_mib,
                    gi=gi,
                )
                found.append(orphan)
                self._once(
                    ("orphan", index, info.id, info.placement.start),
                    logging.WARNING,
                    "GPU %d: GPU instance %d (%s at slot %d) has no compute instance: it holds "
                    "its slots and no workload can use it; destroy it (nvidia-smi mig -i %d "
                    "-gi %d -dgi) or, with --manage-mig, allocate that profile at that slot",
                    index,
                    info.id,
                    shape.name,
                    info.placement.start,
                    index,
                    info.id,
                )
        return found

    # --- MIG allocations ------------------------------------------------------------------

    def _match(
        self, index: int, devices: list[MigDevice], profile: MigProfile, start: int
    ) -> MigDevice | None:
        """The live device for `profile` at `start`. Where placement cannot be read, a device
        of that profile already handed out for that slot, else one not handed out."""
        fits = [d for d in devices if d.uuid is not None and d.fits(profile)]
        for device in fits:
            if device.start == start:
                return device
        unplaced = [d for d in fits if d.start is None]
        for device in unplaced:
            if self._given.get(device.uuid) == (index, start):
                return device
        return next((d for d in unplaced if d.uuid not in self._given), None)

    def ensure_mig(self, index: int, profile: MigProfile, start: int) -> str:
        """The UUID of the MIG device at that placement; created only with --manage-mig."""
        try:
            uuid = self._worker.call(self.change_timeout, self._ensure_mig, index, profile, start)
        except NvmlHung as exc:
            raise ApiError(503, "nvml_hung", f"GPU {index}: {exc}") from exc
        except pynvml.NVMLError as exc:
            raise conflict(
                "mig_error", f"NVML failed on {profile.name} at slot {start} of GPU {index}: {exc}"
            ) from exc
        self._given[uuid] = (index, start)
        return uuid

    def _ensure_mig(self, index: int, profile: MigProfile, start: int) -> str:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        devices = self._mig_devices(index, handle, Reads(), orphans=True)
        device = self._match(index, devices, profile, start)
        if device is not None:
            if device.gi_id is not None:
                self._instances[device.uuid] = (index, device.gi_id)
            return device.uuid
        adopt = None
        for other in devices:
            if other.start is None or not overlaps(start, profile.size, other.start, other.size):
                continue
            if other.uuid is None and other.start == start and other.fits(profile):
                adopt = other  # an orphan of that very profile and slot: give it its CI
                continue
            what = "an orphan GPU instance" if other.uuid is None else "MIG device"
            raise conflict(
                "mig_slots_taken",
                f"GPU {index}: {profile.name} at slot {start} overlaps {what} "
                f"{other.where()}, which no allocation of this agent holds",
            )
        if not self.manage_mig:
            hint = f" (GPU instance {adopt.gi_id} there has no compute instance)" if adopt else ""
            raise conflict(
                "mig_device_missing",
                f"GPU {index} has no {profile.name} MIG device at slot {start}{hint}; create "
                "it, or run the agent with --manage-mig",
            )
        return self._create_mig(index, handle, profile, start, adopt)

    def _create_mig(
        self, index: int, handle, profile: MigProfile, start: int, adopt: MigDevice | None
    ) -> str:
        """Create the GPU instance (unless an orphan is adopted) and its compute instance;
        whatever a failed create made is destroyed again."""
        if adopt is None:
            info = self._profile_info(handle, CREATE[(profile.compute, profile.size)])
            placement = pynvml.c_nvmlGpuInstancePlacement_t(start, profile.size)
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                handle, info.id, ctypes.byref(placement)
            )
        else:
            gi = adopt.gi
        ci = None
        try:
            ci_info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi,
                CI_PROFILES[profile.compute],
                pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
            gi_id = pynvml.nvmlGpuInstanceGetInfo(gi).id
            for device in self._mig_devices(index, handle, Reads()):
                if device.gi_id == gi_id and device.uuid is not None:
                    self._instances[device.uuid] = (index, gi_id)
                    log.info("GPU %d: created MIG %s at slot %d", index, profile.name, start)
                    return device.uuid
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        except pynvml.NVMLError:
            self._undo(index, None if adopt else gi, ci)
            raise

    def _undo(self, index: int, gi, ci) -> None:
        for what, instance, destroy in (
            ("compute", ci, pynvml.nvmlComputeInstanceDestroy),
            ("GPU", gi, pynvml.nvmlGpuInstanceDestroy),
        ):
            if instance is None:
                continue
            try:
                destroy(instance)
            except pynvml.NVMLError as exc:
                log.error(
                    "GPU %d: the %s instance of a failed MIG create could not be destroyed "
                    "(NVML: %s); it is left behind and reported as an orphan",
                    index,
                    what,
                    exc,
                )

    def release_mig(self, index: int, mig_uuid: str) -> None:
        """Destroy an allocation's MIG device with --manage-mig (else leave it to the
        operator). A device still in use, or that NVML fails to destroy, raises: the caller
        keeps the allocation and deleting it again retries."""
        if self.manage_mig:
            try:
                self._worker.call(self.change_timeout, self._release, index, mig_uuid)
            except NvmlHung as exc:
                raise ApiError(503, "nvml_hung", f"GPU {index}: {exc}") from exc
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_IN_USE:
                    raise ApiError(
                        503,
                        "mig_in_use",
                        f"MIG device {mig_uuid} on GPU {index} is still in use (NVML: {exc}); "
                        "it is kept, with its allocation: delete again once its processes "
                        "have exited",
                    ) from exc
                raise conflict(
                    "mig_error",
                    f"GPU {index}: MIG device {mig_uuid} could not be destroyed (NVML: {exc}); "
                    "it is kept, with its allocation",
                ) from exc
        self._given.pop(mig_uuid, None)
        self._instances.pop(mig_uuid, None)

    def _release(self, index: int, mig_uuid: str) -> None:
        for attempt in range(RELEASE_TRIES):
            try:
                self._destroy(index, mig_uuid)
                return
            except pynvml.NVMLError as exc:
                if exc.value != pynvml.NVML_ERROR_IN_USE or attempt == RELEASE_TRIES - 1:
                    raise
            time.sleep(self.release_pause)

    def _destroy(self, index: int, mig_uuid: str) -> None:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        devices = self._mig_devices(index, handle, Reads())
        device = next((d for d in devices if d.uuid == mig_uuid), None)
        if device is None:
            # gone already, or only its compute instance is (an earlier try destroyed it):
            # then the GPU instance this agent made for it is an orphan to destroy
            gi_id = self._instances.get(mig_uuid, (index, None))[1]
            if gi_id is None:
                return
            try:
                gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_NOT_FOUND:
                    return
                raise
            pynvml.nvmlGpuInstanceDestroy(gi)
            log.info("GPU %d: destroyed GPU instance %d left by %s", index, gi_id, mig_uuid)
            return
        gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, device.gi_id)
        ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, device.ci_id)
        self._instances[mig_uuid] = (index, device.gi_id)
        pynvml.nvmlComputeInstanceDestroy(ci)
        if not any(d.gi_id == device.gi_id and d.uuid != mig_uuid for d in devices):
            pynvml.nvmlGpuInstanceDestroy(gi)
        log.info("GPU %d: destroyed MIG device %s", index, mig_uuid)

    # --- samples --------------------------------------------------------------------------

    def sample(self, allocations: list[Allocation]) -> list[dict]:
        try:
            return self._worker.call(self.timeout, self._sample, allocations)
        except NvmlHung:
            return self._blank(allocations)

    def _mig_utilization(self) -> dict[tuple[int, int], float | None]:
        if not self.mig_gpus or self._dcgm is None:
            return {}
        if self._dcgm is AUTO:
            self._dcgm, self.dcgm_status = dcgm.connect()
            log.info("%s", self.dcgm_status)
            if self._dcgm is None:
                return {}
        return self._dcgm.read()

    def _sample(self, allocations: list[Allocation]) -> list[dict]:
        running = [a for a in allocations if a.state == "running"]
        samples, gpu_samples = [], {}
        mig_util = self._mig_utilization()
        for index in range(self.count):
            gpu_sample, mig_samples, proc_util = self._read(index, mig_util)
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

    def _blank(self, allocations: list[Allocation]) -> list[dict]:
        """Samples while NVML hangs: every GPU unhealthy, nothing read."""
        ts = time.time()
        gpus = [
            make_sample(ts, "gpu", index, self._known.get(index, {}).get("uuid"), healthy=False)
            for index in range(self.count)
        ]
        samples = list(gpus)
        for alloc in allocations:
            if alloc.state != "running":
                continue
            if alloc.mode == "whole":
                samples.append(whole_view(alloc, [gpus[i] for i in alloc.gpus]))
            elif alloc.mode == "shared":
                samples.append(shared_view(alloc, gpus[alloc.gpus[0]], None, None, []))
        return samples

    def _read(
        self, index: int, mig_util: dict
    ) -> tuple[dict, dict[str, dict], dict[int, float] | None]:
        """A GPU's sample, its MIG devices' samples, and its per-process SM utilization
        (None when NVML cannot give it)."""
        ts = time.time()
        uuid = self._known.get(index, {}).get("uuid")
        reads = Reads()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            mig = self._mig_mode(handle, reads)[0]
            util = reads.get(pynvml.nvmlDeviceGetUtilizationRates, handle)
            memory = reads.get(pynvml.nvmlDeviceGetMemoryInfo, handle)
            power_mw = reads.get(pynvml.nvmlDeviceGetPowerUsage, handle)
            power = round(power_mw / 1000, 1) if power_mw is not None else None
            temperature = _temperature(handle, reads)
            clock = reads.get(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
            devices = self._mig_devices(index, handle, reads) if mig else []
            ecc = _ecc(handle, reads)
            if ecc is None and devices:  # MIG: volatile ECC only per MIG device (nvml.h)
                ecc = _sum([device.ecc for device in devices])
            used = memory.used // MIB if memory else None
            if memory is None and devices:  # MIG without privileges: its devices' sum
                used = _sum([device.used_mib for device in devices])
            total = memory.total // MIB if memory else self._known.get(index, {}).get("memory_mib")
            gpu = make_sample(
                ts,
                "gpu",
                index,
                uuid,
                gpu_util=util.gpu if util else None,
                mem_used_mib=used,
                mem_total_mib=total,
                temperature_c=temperature,
                power_w=power,
                sm_clock_mhz=clock,
                ecc_errors=ecc,
                healthy=not ecc,
                processes=_processes(handle, reads),
            )
            migs = {}
            for device in devices:
                device_ecc = device.ecc if device.ecc is not None else ecc
                migs[device.uuid] = make_sample(
                    ts,
                    "mig",
                    index,
                    uuid,
                    mig_uuid=device.uuid,
                    gpu_util=mig_util.get((index, device.gi_id)),
                    mem_used_mib=device.used_mib,
                    mem_total_mib=device.memory_mib,
                    # the GPU's: NVML reads none of these per MIG device
                    temperature_c=temperature,
                    power_w=power,
                    sm_clock_mhz=clock,
                    ecc_errors=device_ecc,
                    healthy=not (device_ecc or ecc),
                    processes=_processes(device.handle, reads, "MIG device: "),
                )
            proc_util = None if mig else self._process_util(index, handle, reads)
            self._recovered(index)
            return gpu, migs, proc_util
        except pynvml.NVMLError as exc:
            self._failed(index, exc)
            return make_sample(ts, "gpu", index, uuid, healthy=False), {}, None
        finally:
            self.readings[index] = {**self.readings.get(index, {}), **reads.outcomes}

    def _process_util(self, index: int, handle, reads: Reads) -> dict[int, float] | None:
        last = self._util_ts.get(index, 0)
        try:
            rows = pynvml.nvmlDeviceGetProcessUtilization(handle, last)
        except pynvml.NVMLError as exc:
            if _gpu_failed(exc):
                raise
            # NOT_FOUND: no process used the GPU since `last`
            if exc.value == pynvml.NVML_ERROR_NOT_FOUND:
                reads.note("nvmlDeviceGetProcessUtilization", None)
                return {}
            reads.note("nvmlDeviceGetProcessUtilization", exc)
            return None
        reads.note("nvmlDeviceGetProcessUtilization", None)
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

    def close(self) -> None:
        self._worker.close()
        if self._dcgm not in (None, AUTO):
            close = getattr(self._dcgm, "close", None)
            if close:
                close()
