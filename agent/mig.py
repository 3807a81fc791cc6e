"""MIG geometry: profiles, their legal start slots, and overlap of placed instances.

A MIG-capable GPU has 8 memory slots. Each profile occupies `size` consecutive slots and
may only start at fixed slots; placed instances may not overlap.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class MigProfile:
    name: str
    compute: int  # compute slices, the "N" of "Ng"
    size: int  # memory slots out of 8
    starts: tuple[int, ...]
    memory_mib: int


# (compute slices, memory slots, legal starts) of the six profile shapes, in the order in
# which every model lists its profile names: 1g, 1g double-memory, 2g, 3g, 4g, 7g.
SHAPES = (
    (1, 1, (0, 1, 2, 3, 4, 5, 6)),
    (1, 2, (0, 2, 4, 6)),
    (2, 2, (0, 2, 4)),
    (3, 4, (0, 4)),
    (4, 4, (0,)),
    (7, 8, (0,)),
)


def build_profiles(names: tuple[str, ...], memories: tuple[int, ...]) -> dict[str, MigProfile]:
    return {
        name: MigProfile(name, compute, size, starts, memory)
        for name, memory, (compute, size, starts) in zip(names, memories, SHAPES, strict=True)
    }


def placement_error(profile: MigProfile, start: int, size: int) -> str | None:
    """Why `start`/`size` is not a legal placement of `profile`, or None when it is."""
    if size != profile.size:
        return f"{profile.name} spans {profile.size} memory slots, not {size}"
    if start not in profile.starts:
        legal = ", ".join(str(s) for s in profile.starts)
        return f"{profile.name} may start at slot {legal}, not {start}"
    return None


def overlaps(start_a: int, size_a: int, start_b: int, size_b: int) -> bool:
    return start_a < start_b + size_b and start_b < start_a + size_a


def profile_by_shape(profiles: dict[str, MigProfile], compute: int, size: int) -> MigProfile | None:
    for profile in profiles.values():
        if profile.compute == compute and profile.size == size:
            return profile
    return None
