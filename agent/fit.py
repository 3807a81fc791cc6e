"""Whether a new allocation fits next to the ones a host already holds."""

from agent.allocations import Allocation
from agent.errors import conflict
from agent.mig import overlaps


def check_placement(spec: dict, gpus: list[dict], allocations: list[Allocation]) -> None:
    """Raise a 409 ApiError when `spec` cannot be placed; every allocation holds its slice
    until it is deleted, whatever its state."""
    mode = spec["mode"]
    for index in spec["gpus"]:
        gpu = gpus[index]
        if not gpu["healthy"]:
            raise conflict("gpu_unhealthy", f"GPU {index} is unhealthy: {gpu['health_reason']}")
        if gpu["mode"] != mode:
            raise conflict("gpu_mode_mismatch", f"GPU {index} is in {gpu['mode']} mode, not {mode}")
        neighbours = [a for a in allocations if index in a.gpus]
        for other in neighbours:
            if mode == "whole" or other.mode != mode:
                raise conflict("gpu_busy", f"GPU {index} is held by allocation {other.id}")
            mig, theirs = spec["mig"], other.spec["mig"]
            if mig and overlaps(mig["start"], mig["size"], theirs["start"], theirs["size"]):
                raise conflict(
                    "mig_overlap",
                    f"{mig['profile']} at slot {mig['start']} overlaps allocation {other.id} "
                    f"({theirs['profile']} at slot {theirs['start']}) on GPU {index}",
                )
        if mode == "shared":
            _check_share(spec["shared"], gpu, [a.spec["shared"] for a in neighbours])


def _check_share(share: dict, gpu: dict, held: list[dict]) -> None:
    milli = share["milli"] + sum(s["milli"] for s in held)
    if milli > 1000:
        raise conflict(
            "shared_capacity",
            f"GPU {gpu['index']} would be shared {milli}/1000 with {share['milli']} more milli-GPU",
        )
    memory = share["memory_mib"] + sum(s["memory_mib"] for s in held)
    if gpu["memory_mib"] is not None and memory > gpu["memory_mib"]:
        raise conflict(
            "shared_capacity",
            f"GPU {gpu['index']} memory caps would total {memory} MiB of {gpu['memory_mib']} MiB",
        )
