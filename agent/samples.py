"""Metric samples: one reading of a GPU, a MIG device, or an allocation's slice."""

from agent.allocations import Allocation


def make_sample(
    ts: float,
    kind: str,
    gpu_index: int,
    gpu_uuid: str | None,
    *,
    mig_uuid: str | None = None,
    allocation: str | None = None,
    gpu_util: float | None = None,
    mem_used_mib: int | None = None,
    mem_total_mib: int | None = None,
    temperature_c: float | None = None,
    power_w: float | None = None,
    sm_clock_mhz: int | None = None,
    ecc_errors: int | None = None,
    healthy: bool = True,
    processes: list[dict] | None = None,
) -> dict:
    return {
        "ts": ts,
        "kind": kind,
        "gpu_index": gpu_index,
        "gpu_uuid": gpu_uuid,
        "mig_uuid": mig_uuid,
        "allocation": allocation,
        "gpu_util": gpu_util,
        "mem_used_mib": mem_used_mib,
        "mem_total_mib": mem_total_mib,
        "temperature_c": temperature_c,
        "power_w": power_w,
        "sm_clock_mhz": sm_clock_mhz,
        "ecc_errors": ecc_errors,
        "healthy": healthy,
        "processes": processes or [],
    }


def _each(samples: list[dict], key: str) -> list | None:
    values = [s[key] for s in samples]
    return None if None in values else values


def _merge_processes(samples: list[dict]) -> list[dict]:
    used: dict[int, int | None] = {}
    for sample in samples:
        for proc in sample["processes"]:
            before, more = used.get(proc["pid"], 0), proc["used_mib"]
            used[proc["pid"]] = None if before is None or more is None else before + more
    return [{"pid": pid, "used_mib": mib} for pid, mib in used.items()]


def whole_view(alloc: Allocation, gpu_samples: list[dict]) -> dict:
    """A whole-GPU allocation's sample: its GPUs' readings, averaged or summed."""
    first = gpu_samples[0]
    util = _each(gpu_samples, "gpu_util")
    used, total = _each(gpu_samples, "mem_used_mib"), _each(gpu_samples, "mem_total_mib")
    temperature, power = _each(gpu_samples, "temperature_c"), _each(gpu_samples, "power_w")
    clock, ecc = _each(gpu_samples, "sm_clock_mhz"), _each(gpu_samples, "ecc_errors")
    return make_sample(
        first["ts"],
        "allocation",
        first["gpu_index"],
        first["gpu_uuid"],
        allocation=alloc.id,
        gpu_util=round(sum(util) / len(util), 1) if util is not None else None,
        mem_used_mib=sum(used) if used is not None else None,
        mem_total_mib=sum(total) if total is not None else None,
        temperature_c=max(temperature) if temperature is not None else None,
        power_w=round(sum(power), 1) if power is not None else None,
        sm_clock_mhz=max(clock) if clock is not None else None,
        ecc_errors=sum(ecc) if ecc is not None else None,
        healthy=all(s["healthy"] for s in gpu_samples),
        processes=_merge_processes(gpu_samples),
    )


def mig_view(alloc: Allocation, mig_sample: dict) -> dict:
    """A MIG allocation's sample: its MIG device's reading."""
    return {**mig_sample, "kind": "allocation", "allocation": alloc.id}


def shared_view(
    alloc: Allocation,
    gpu_sample: dict,
    util: float | None,
    mem_used_mib: int | None,
    processes: list[dict],
) -> dict:
    """A shared allocation's sample: `util` is its use of its share (0-100), memory is its own
    against its cap, power its share of the GPU's."""
    milli = alloc.spec["shared"]["milli"]
    power = gpu_sample["power_w"]
    return make_sample(
        gpu_sample["ts"],
        "allocation",
        gpu_sample["gpu_index"],
        gpu_sample["gpu_uuid"],
        allocation=alloc.id,
        gpu_util=util,
        mem_used_mib=mem_used_mib,
        mem_total_mib=alloc.spec["shared"]["memory_mib"],
        temperature_c=gpu_sample["temperature_c"],
        power_w=round(power * milli / 1000, 1) if power is not None else None,
        sm_clock_mhz=gpu_sample["sm_clock_mhz"],
        ecc_errors=gpu_sample["ecc_errors"],
        healthy=gpu_sample["healthy"],
        processes=processes,
    )
