"""GPU models the agent knows: memory, MIG profiles, and the envelope the simulator follows."""

import re
from dataclasses import dataclass, field

from agent.mig import MigProfile, build_profiles

IDLE_TEMPERATURE_C = 30.0
IDLE_SM_CLOCK_MHZ = 210

NAMES_80GB = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
MEMORY_80GB = (9728, 19968, 19968, 40192, 40192, 81152)
NAMES_H200 = ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")
MEMORY_H200 = (17920, 35840, 35840, 71936, 71936, 143360)


@dataclass(frozen=True)
class GpuModel:
    key: str
    name: str
    family: str  # what the marketing name contains, to recognise real GPUs
    memory_mib: int
    idle_power_w: float
    max_power_w: float
    max_temperature_c: float
    max_sm_clock_mhz: int
    mig_profiles: dict[str, MigProfile] = field(default_factory=dict)


MODELS = {
    model.key: model
    for model in (
        GpuModel(
            "a100-80gb",
            "NVIDIA A100-SXM4-80GB",
            "a100",
            81920,
            60.0,
            400.0,
            75.0,
            1410,
            build_profiles(NAMES_80GB, MEMORY_80GB),
        ),
        GpuModel(
            "h100-80gb",
            "NVIDIA H100 80GB HBM3",
            "h100",
            81559,
            70.0,
            700.0,
            80.0,
            1980,
            build_profiles(NAMES_80GB, MEMORY_80GB),
        ),
        GpuModel(
            "h200-141gb",
            "NVIDIA H200",
            "h200",
            143771,
            75.0,
            700.0,
            80.0,
            1980,
            build_profiles(NAMES_H200, MEMORY_H200),
        ),
        GpuModel("l4", "NVIDIA L4", "l4", 23034, 16.0, 72.0, 70.0, 2040),
    )
}

# a real GPU of a known family counts as that model when its memory is this close
MEMORY_TOLERANCE_MIB = 8192


def _memory_gb(model: GpuModel) -> int:
    """The memory size a model's marketing name states ("80GB"), from its key or its memory."""
    match = re.search(r"([0-9]+)gb\Z", model.key)
    return int(match.group(1)) if match else round(model.memory_mib / 1024)


def model_key(name: str, memory_mib: int | None) -> str:
    """The catalog key of a real GPU from its NVML name and memory, else a slug of its name.

    With its memory unknown (NVML refuses a MIG-enabled GPU's memory to an unprivileged
    process) the name alone decides: a model of the family whose size the name states, or the
    only model of the family when the name states none ("NVIDIA H200")."""
    lowered = name.lower()
    words = set(re.split(r"[^a-z0-9]+", lowered))
    family = [model for model in MODELS.values() if model.family in words]
    for model in family:
        if memory_mib is not None and abs(memory_mib - model.memory_mib) <= MEMORY_TOLERANCE_MIB:
            return model.key
    if memory_mib is None:
        sizes = {int(size) for size in re.findall(r"(\d+)\s*gb", lowered)}
        named = [model for model in family if not sizes or _memory_gb(model) in sizes]
        if len(named) == 1:
            return named[0].key
    slug = re.sub(r"[^a-z0-9]+", "-", lowered.removeprefix("nvidia ")).strip("-")
    return slug or "unknown"


def mig_profiles(key: str | None) -> dict[str, MigProfile]:
    model = MODELS.get(key or "")
    return model.mig_profiles if model else {}
