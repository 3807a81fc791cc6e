"""MIG geometry: every profile's legal starts, sizes and overlaps (ARCHITECTURE.md's table)."""

import itertools

import pytest

from agent.gpu_models import MODELS, mig_profiles
from agent.mig import overlaps, placement_error, profile_by_shape

SLOTS = 8  # memory slots of a MIG-capable GPU
# profile name -> (memory slots, legal starts), per ARCHITECTURE.md
GEOMETRY_80GB = {
    "1g.10gb": (1, (0, 1, 2, 3, 4, 5, 6)),
    "1g.20gb": (2, (0, 2, 4, 6)),
    "2g.20gb": (2, (0, 2, 4)),
    "3g.40gb": (4, (0, 4)),
    "4g.40gb": (4, (0,)),
    "7g.80gb": (8, (0,)),
}
GEOMETRY_H200 = {
    "1g.18gb": (1, (0, 1, 2, 3, 4, 5, 6)),
    "1g.35gb": (2, (0, 2, 4, 6)),
    "2g.35gb": (2, (0, 2, 4)),
    "3g.71gb": (4, (0, 4)),
    "4g.71gb": (4, (0,)),
    "7g.141gb": (8, (0,)),
}
EXPECTED = {"a100-80gb": GEOMETRY_80GB, "h100-80gb": GEOMETRY_80GB, "h200-141gb": GEOMETRY_H200}


@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_profile_tables(model):
    profiles = mig_profiles(model)
    assert {name: (p.size, p.starts) for name, p in profiles.items()} == EXPECTED[model]
    for profile in profiles.values():
        assert profile.name.startswith(f"{profile.compute}g.")
        assert profile.memory_mib <= MODELS[model].memory_mib


def test_l4_has_no_mig():
    assert mig_profiles("l4") == {}
    assert mig_profiles("unknown-gpu") == {}


@pytest.mark.parametrize(
    ("model", "name"),
    [(model, name) for model, table in sorted(EXPECTED.items()) for name in table],
)
def test_every_start_slot(model, name):
    profile = mig_profiles(model)[name]
    size, legal = EXPECTED[model][name]
    for start in range(SLOTS + 1):
        error = placement_error(profile, start, size)
        assert (error is None) == (start in legal), (name, start, error)
    assert "slots" in placement_error(profile, legal[0], size + 1)


def test_overlaps():
    assert overlaps(0, 4, 3, 1)
    assert overlaps(4, 4, 0, 8)
    assert overlaps(2, 2, 3, 1)
    assert not overlaps(0, 4, 4, 4)
    assert not overlaps(6, 2, 4, 2)
    assert not overlaps(0, 1, 1, 1)


@pytest.mark.parametrize(
    "layout",
    [
        [("1g.10gb", s) for s in range(7)],
        [("3g.40gb", 0), ("3g.40gb", 4)],
        [("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)],
        [("1g.20gb", 0), ("2g.20gb", 2), ("1g.20gb", 4), ("1g.20gb", 6)],
        [("7g.80gb", 0)],
    ],
)
def test_legal_layouts_do_not_overlap(layout):
    profiles = mig_profiles("a100-80gb")
    placed = [(profiles[name], start) for name, start in layout]
    for profile, start in placed:
        assert placement_error(profile, start, profile.size) is None
    for (a, sa), (b, sb) in itertools.combinations(placed, 2):
        assert not overlaps(sa, a.size, sb, b.size)


def test_profile_by_shape_names_real_mig_devices():
    profiles = mig_profiles("h200-141gb")
    assert profile_by_shape(profiles, 1, 1).name == "1g.18gb"
    assert profile_by_shape(profiles, 1, 2).name == "1g.35gb"
    assert profile_by_shape(profiles, 2, 2).name == "2g.35gb"
    assert profile_by_shape(profiles, 3, 4).name == "3g.71gb"
    assert profile_by_shape(profiles, 4, 4).name == "4g.71gb"
    assert profile_by_shape(profiles, 7, 8).name == "7g.141gb"
    assert profile_by_shape(profiles, 6, 8) is None
