"""The fast check of a sample (samples._sample_fine) passes only what the full check
(_sample_problems) finds nothing wrong with, and passes a well-formed sample: every batch's
samples go through the fast one, and what it lets by is kept, charted and exported."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from console.metrics.samples import _sample_fine, _sample_problems
from tests.metrics.test_fuzz_samples import NOW, sample, valid_sample

pytestmark = pytest.mark.slow  # property-based: many examples


class Subclassed(float):
    pass


@settings(max_examples=3000, deadline=None)
@given(sample())
def test_what_the_fast_check_passes_the_full_check_passes(hostile):
    if _sample_fine(hostile, NOW):
        assert _sample_problems(hostile, NOW) == {}


@settings(max_examples=500, deadline=None)
@given(valid_sample(), st.sampled_from(["processes", "ecc_errors", "mig_uuid", None]))
def test_a_well_formed_sample_takes_the_fast_way(good, left_out):
    good["processes"] = [{"pid": 1, "used_mib": 10}]
    if left_out:
        del good[left_out]
    now = good["ts"]
    assert _sample_problems(good, now) == {}
    assert _sample_fine(good, now)


def test_a_subclass_of_a_number_is_left_to_the_full_check():
    good = {"ts": NOW, "kind": "gpu", "gpu_index": 0, "healthy": True, "gpu_util": Subclassed(5)}
    assert not _sample_fine(good, NOW)
    assert _sample_problems(good, NOW) == {}
