"""Simulated GPUs whose metrics follow the workloads placed on them, with injectable faults.

A workload's utilisation is what its launch's `sim` asks for; else, where the runtime runs a real
process or container, its CPU use (one busy core: 100 %, so an idle demo instance reads ~0 %
and a busy one does not); else a steady load picked from its id."""

import random
import time
import uuid
import zlib
from dataclasses import dataclass, field

from agent.allocations import Allocation
from agent.cpu import CpuMeter
from agent.errors import conflict
from agent.gpu_models import IDLE_SM_CLOCK_MHZ, IDLE_TEMPERATURE_C, GpuModel
from agent.mig import MigProfile
from agent.samples import make_sample, mig_view, shared_view, whole_view

NAMESPACE = uuid.UUID("5b0c2a34-7d1e-4f6a-9c3b-2e8d4f1a6b70")
DRIVER_VERSION = "550.54.15"
CUDA_VERSION = "12.4"
FAULTS = ("xid79", "ecc", "clear")
# how far the temperature moves toward its target on each sample
THERMAL_STEP = 0.3
# A simulated host offers what a typical 8-GPU server has per GPU, whatever the machine it runs
# on has: the specs of a real catalog fit it. `make run` says so in its banner, and the console
# marks the host as simulated.
SIM_CPUS_PER_GPU = 16
SIM_MEMORY_MIB_PER_GPU = 128 * 1024


def sim_capacity(gpus: int) -> tuple[int, int]:
    """(vCPUs, RAM MiB) a simulated host with `gpus` GPUs offers by default."""
    return SIM_CPUS_PER_GPU * gpus, SIM_MEMORY_MIB_PER_GPU * gpus


def sim_uuid(prefix: str, seed: str) -> str:
    return f"{prefix}-{uuid.uuid5(NAMESPACE, seed)}"


@dataclass
class SimGpu:
    index: int
    uuid: str
    mode: str
    temperature_c: float = IDLE_TEMPERATURE_C
    lost: bool = False
    ecc_errors: int = 0
    mig_devices: dict[str, tuple[MigProfile, int]] = field(default_factory=dict)

    def health_reason(self) -> str | None:
        if self.lost:
            return "xid79: GPU has fallen off the bus"
        if self.ecc_errors:
            return f"ecc: {self.ecc_errors} volatile uncorrected ECC errors"
        return None


class SimBackend:
    name = "sim"

    def __init__(self, hostname: str, model: GpuModel, modes: list[str]):
        self.model = model
        self._gpus = [
            SimGpu(index, sim_uuid("GPU", f"{hostname}/{index}"), mode)
            for index, mode in enumerate(modes)
        ]
        self._random = random.Random()  # noqa: S311 - metric noise, not secrets
        self._cpu: CpuMeter | None = None

    def follow_cpu(self, read) -> None:
        """Let each workload's utilisation follow its CPU use (`read(alloc)`: its CPU seconds,
        the runtime's reading): one busy core reads 100 %, an idle container 0 %."""
        self._cpu = CpuMeter(read)

    def gpus(self) -> list[dict]:
        return [self._inventory(gpu) for gpu in self._gpus]

    def _inventory(self, gpu: SimGpu) -> dict:
        mig = gpu.mode == "mig"
        devices = sorted(gpu.mig_devices.items(), key=lambda item: item[1][1])
        return {
            "index": gpu.index,
            "uuid": gpu.uuid,
            "name": self.model.name,
            "model": self.model.key,
            "pci_bus_id": f"00000000:{0x10 + gpu.index:02X}:00.0",
            "memory_mib": self.model.memory_mib,
            "mode": gpu.mode,
            "mig_enabled": mig,
            "mig_pending": mig,
            "healthy": gpu.health_reason() is None,
            "health_reason": gpu.health_reason(),
            "driver_version": DRIVER_VERSION,
            "cuda_version": CUDA_VERSION,
            "mig_devices": [
                {
                    "uuid": mig_uuid,
                    "profile": profile.name,
                    "start": start,
                    "size": profile.size,
                    "memory_mib": profile.memory_mib,
                }
                for mig_uuid, (profile, start) in devices
            ],
        }

    def set_mode(self, index: int, mode: str) -> None:
        if mode == "mig" and not self.model.mig_profiles:
            raise conflict("mode_unsupported", f"{self.model.name} has no MIG")
        self._gpus[index].mode = mode

    def ensure_mig(self, index: int, profile: MigProfile, start: int) -> str:
        gpu = self._gpus[index]
        mig_uuid = sim_uuid("MIG", f"{gpu.uuid}/{profile.name}/{start}")
        gpu.mig_devices[mig_uuid] = (profile, start)
        return mig_uuid

    def release_mig(self, index: int, mig_uuid: str) -> None:
        self._gpus[index].mig_devices.pop(mig_uuid, None)

    def inject(self, index: int, fault: str) -> None:
        gpu = self._gpus[index]
        if fault == "xid79":
            gpu.lost = True
        elif fault == "ecc":
            gpu.ecc_errors += 1
        else:
            gpu.lost, gpu.ecc_errors = False, 0

    def lost_gpus(self) -> set[int]:
        return {gpu.index for gpu in self._gpus if gpu.lost}

    def _cap_mib(self, alloc: Allocation) -> int:
        if alloc.mode == "shared":
            return alloc.spec["shared"]["memory_mib"]
        if alloc.mode == "mig":
            return self.model.mig_profiles[alloc.spec["mig"]["profile"]].memory_mib
        return self.model.memory_mib

    def _load(self, alloc: Allocation) -> tuple[float, int]:
        """(utilization 0-100 of its slice, memory in MiB per GPU) of a running allocation:
        what its body's `sim` asks for, else a steady load picked from its id."""
        seed = zlib.crc32(alloc.id.encode())
        sim = alloc.spec["sim"] or {}
        mem = sim.get("mem_mib", self._cap_mib(alloc) * (25 + (seed >> 8) % 50) // 100)
        used = self._cpu.percent(alloc) if self._cpu and "util" not in sim else None
        if used is not None:
            return round(used, 1), mem
        util = sim.get("util", 40 + seed % 50)
        if util:
            util = min(100.0, max(0.0, util + self._random.uniform(-2.0, 2.0)))
        return round(util, 1), mem

    def _share(self, alloc: Allocation, util: float) -> float:
        """The part of the whole GPU that `util` of this allocation's slice keeps busy."""
        if alloc.mode == "shared":
            return util * alloc.spec["shared"]["milli"] / 1000
        if alloc.mode == "mig":
            return util * self.model.mig_profiles[alloc.spec["mig"]["profile"]].compute / 7
        return util

    def sample(self, allocations: list[Allocation]) -> list[dict]:
        running = [a for a in allocations if a.state == "running"]
        loads = {a.id: self._load(a) for a in running}
        if self._cpu:
            self._cpu.forget_others(set(loads))
        samples, gpu_samples = [], {}
        for gpu in self._gpus:
            on_gpu = [a for a in running if gpu.index in a.gpus]
            gpu_sample = self._gpu_sample(gpu, on_gpu, loads)
            gpu_samples[gpu.index] = gpu_sample
            samples.append(gpu_sample)
            for alloc in on_gpu:
                if alloc.mode == "shared":
                    util, mem = loads[alloc.id] if not gpu.lost else (None, None)
                    procs = [{"pid": alloc.pid, "used_mib": mem}] if alloc.pid else []
                    samples.append(shared_view(alloc, gpu_sample, util, mem, procs))
            by_device = {a.mig_uuid: a for a in on_gpu if a.mode == "mig"}
            for mig_uuid, (profile, _start) in gpu.mig_devices.items():
                alloc = by_device.get(mig_uuid)
                mig_sample = self._mig_sample(
                    gpu, gpu_sample["ts"], mig_uuid, profile, alloc, loads
                )
                samples.append(mig_sample)
                if alloc:
                    samples.append(mig_view(alloc, mig_sample))
        for alloc in running:
            if alloc.mode == "whole":
                samples.append(whole_view(alloc, [gpu_samples[i] for i in alloc.gpus]))
        return samples

    def _gpu_sample(self, gpu: SimGpu, on_gpu: list[Allocation], loads: dict) -> dict:
        ts = time.time()
        if gpu.lost:
            return make_sample(ts, "gpu", gpu.index, gpu.uuid, healthy=False)
        model = self.model
        util = min(100.0, sum(self._share(a, loads[a.id][0]) for a in on_gpu))
        target = IDLE_TEMPERATURE_C + (model.max_temperature_c - IDLE_TEMPERATURE_C) * util / 100
        gpu.temperature_c += (target - gpu.temperature_c) * THERMAL_STEP
        power = model.idle_power_w + (model.max_power_w - model.idle_power_w) * util / 100
        return make_sample(
            ts,
            "gpu",
            gpu.index,
            gpu.uuid,
            gpu_util=round(util, 1),
            mem_used_mib=sum(loads[a.id][1] for a in on_gpu),
            mem_total_mib=model.memory_mib,
            temperature_c=round(gpu.temperature_c + self._random.uniform(-0.3, 0.3), 1),
            power_w=round(power * self._random.uniform(0.98, 1.02), 1),
            sm_clock_mhz=model.max_sm_clock_mhz if util >= 1 else IDLE_SM_CLOCK_MHZ,
            ecc_errors=gpu.ecc_errors,
            healthy=gpu.health_reason() is None,
            processes=[{"pid": a.pid, "used_mib": loads[a.id][1]} for a in on_gpu if a.pid],
        )

    def _mig_sample(
        self,
        gpu: SimGpu,
        ts: float,
        mig_uuid: str,
        profile: MigProfile,
        alloc: Allocation | None,
        loads: dict,
    ) -> dict:
        if gpu.lost:
            return make_sample(ts, "mig", gpu.index, gpu.uuid, mig_uuid=mig_uuid, healthy=False)
        util, mem = loads[alloc.id] if alloc else (0.0, 0)
        return make_sample(
            ts,
            "mig",
            gpu.index,
            gpu.uuid,
            mig_uuid=mig_uuid,
            gpu_util=util,
            mem_used_mib=mem,
            mem_total_mib=profile.memory_mib,
            ecc_errors=gpu.ecc_errors,
            healthy=gpu.health_reason() is None,
            processes=[{"pid": alloc.pid, "used_mib": mem}] if alloc and alloc.pid else [],
        )
