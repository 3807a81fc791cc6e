"""MIG geometry: which starts are free on a GPU and how many instances still fit."""

from functools import cache

from console.scheduler.model import MigProfile

# The profiles of an 80 GB A100/H100 (ARCHITECTURE.md, "Partitioning a GPU").
STANDARD_PROFILES = (
    MigProfile("1g.10gb", 1, tuple(range(7))),
    MigProfile("1g.20gb", 2, (0, 2, 4, 6)),
    MigProfile("2g.20gb", 2, (0, 2, 4)),
    MigProfile("3g.40gb", 4, (0, 4)),
    MigProfile("4g.40gb", 4, (0,)),
    MigProfile("7g.80gb", 8, (0,)),
)


def free_starts(used: int, profile: MigProfile) -> tuple[int, ...]:
    """Legal starts of `profile` whose slices are all free in the `used` bitmask."""
    return tuple(s for s in profile.starts if not used & profile.mask(s))


@cache
def max_instances(used: int, profile: MigProfile) -> int:
    """The most instances of `profile` that fit together in the free slices of `used`."""
    return max(
        (1 + max_instances(used | profile.mask(s), profile) for s in free_starts(used, profile)),
        default=0,
    )
