"""MIG device names and shapes from what NVML reports, as NVIDIA names them.

go-nvlib (`pkg/nvlib/device/mig_profile.go`) names a MIG device `<g>g.<gb>gb`, with `<c>c.` in
front when its compute instance takes fewer slices than its GPU instance (`1c.3g.40gb`) and the
profile's attributes after it (`1g.10gb+me`). `<gb>` is the device's share of the GPU's memory
rounded *up* to eighths, times the GPU's memory in whole GiB: an A100-80GB `3g.40gb` has
40192 MiB of 81920, which is 4/8 of 80 GiB, not round(40192 / 1024) = 39. The GPU instance
profile's own name (`nvmlGpuInstanceProfileInfo_v2_t.name`, "MIG 3g.40gb") is preferred when
NVML gives it. No NVML call here: pure functions over values the backend read.
"""

import math
import re
from dataclasses import dataclass

import pynvml

MIB = 1024 * 1024
EIGHTHS = 8


def _profile(name: str) -> int | None:
    return getattr(pynvml, f"NVML_GPU_INSTANCE_PROFILE_{name}", None)


# GPU instance profile (NVML_GPU_INSTANCE_PROFILE_*) -> (compute slices, memory slots, suffix).
# Memory slots are None where they depend on the GPU: the eighths rule gives them.
SHAPES = {
    _profile(name): shape
    for name, shape in (
        ("1_SLICE", (1, 1, "")),
        ("1_SLICE_REV1", (1, 1, "+me")),
        ("1_SLICE_REV2", (1, 2, "")),
        ("1_SLICE_GFX", (1, None, "+gfx")),
        ("1_SLICE_NO_ME", (1, None, "-me")),
        ("1_SLICE_ALL_ME", (1, None, "+me.all")),
        ("2_SLICE", (2, 2, "")),
        ("2_SLICE_REV1", (2, None, "+me")),
        ("2_SLICE_GFX", (2, None, "+gfx")),
        ("2_SLICE_NO_ME", (2, None, "-me")),
        ("2_SLICE_ALL_ME", (2, None, "+me.all")),
        ("3_SLICE", (3, 4, "")),
        ("4_SLICE", (4, 4, "")),
        ("4_SLICE_GFX", (4, None, "+gfx")),
        ("6_SLICE", (6, None, "")),
        ("7_SLICE", (7, 8, "")),
        ("8_SLICE", (8, 8, "")),
    )
    if _profile(name) is not None
}
# the GPU instance profile the agent creates for each shape it offers (compute, memory slots)
CREATE = {
    (1, 1): pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
    (1, 2): pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
    (2, 2): pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    (3, 4): pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
    (4, 4): pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
    (7, 8): pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
}
PLAIN = frozenset(CREATE.values())
# compute instance profile that takes a whole GPU instance of that many compute slices
CI_PROFILES = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
}


@dataclass(frozen=True)
class GiProfile:
    """One GPU instance profile of a GPU, as nvmlDeviceGetGpuInstanceProfileInfo gives it."""

    kind: int  # NVML_GPU_INSTANCE_PROFILE_*
    id: int  # the profile id NVML's create and list calls take
    slices: int
    memory_mib: int
    name: str | None  # "3g.40gb", from the info's name; None when NVML gives none
    instance_count: int
    engines: tuple[int, int, int, int] | None  # decoders, encoders, JPEG, OFA

    @property
    def slots(self) -> int | None:
        shape = SHAPES.get(self.kind)
        return shape[1] if shape else None

    @property
    def suffix(self) -> str:
        shape = SHAPES.get(self.kind)
        return shape[2] if shape else ""


def profile_name(text) -> str | None:
    """ "3g.40gb" out of an NVML profile name ("MIG 3g.40gb", "MIG 1g.10gb+me")."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    match = re.search(r"\d+g\.\d+gb\S*", text or "")
    return match.group(0) if match else None


def memory_gb(mig_mib: int, total_mib: int) -> int:
    """The "<gb>" of a MIG device's name: go-nvlib's getMigMemorySizeGB."""
    fraction = math.ceil(mig_mib / total_mib * EIGHTHS) / EIGHTHS
    total_gb = math.ceil(total_mib / 1024)
    return math.floor(fraction * total_gb + 0.5)  # Go's math.Round: halves away from zero


def memory_slots(mig_mib: int, total_mib: int) -> int:
    """The memory slots (eighths of the GPU) a MIG device of that much memory spans."""
    return math.ceil(mig_mib / total_mib * EIGHTHS)


def with_compute(name: str, gi_slices: int | None, ci_slices: int | None) -> str:
    """`name` of a whole GPU instance, or "<c>c.<name>" for a compute instance of fewer slices."""
    if ci_slices and gi_slices and ci_slices < gi_slices:
        return f"{ci_slices}c.{name}"
    return name


def match_profile(
    profiles: list[GiProfile],
    slices: int | None,
    memory_mib: int | None,
    engines: tuple[int, int, int, int] | None,
) -> GiProfile | None:
    """The GPU instance profile of a MIG device whose placement cannot be read, from its
    attributes: slices and memory, then its engines (1g.10gb and 1g.10gb+me differ only
    there), then the plain profile."""
    same = [p for p in profiles if p.slices == slices and p.memory_mib == memory_mib]
    if len(same) > 1 and engines is not None:
        same = [p for p in same if p.engines == engines] or same
    if len(same) > 1:
        same = [p for p in same if p.kind in PLAIN] or same
    return same[0] if same else None


@dataclass(frozen=True)
class Shape:
    """What a MIG device is: its name, compute slices, memory slots, and whether it is one
    of the whole-instance profiles the agent offers (not a compute split, nor +me…)."""

    name: str | None
    compute: int | None
    slots: int | None
    offered: bool


def shape(
    gi_slices: int | None,
    ci_slices: int | None,
    memory_mib: int | None,
    profile: GiProfile | None,
    total_mib: int | None,
) -> Shape:
    """A MIG device's shape from its attributes, its GPU instance profile (None when it
    cannot be told) and the GPU's memory (None when unknown)."""
    slices = profile.slices if profile else gi_slices
    rule = memory_mib is not None and bool(total_mib)
    base = profile.name if profile and profile.name else None
    if base is None and slices and rule:
        suffix = profile.suffix if profile else ""
        base = f"{slices}g.{memory_gb(memory_mib, total_mib)}gb{suffix}"
    slots = profile.slots if profile else None
    if slots is None and rule:
        slots = memory_slots(memory_mib, total_mib)
    whole = not (ci_slices and slices and ci_slices < slices)
    plain = profile is None or profile.kind in PLAIN
    name = with_compute(base, slices, ci_slices) if base else None
    return Shape(name, slices, slots, whole and plain)
