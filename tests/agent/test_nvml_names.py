"""MIG names as NVIDIA writes them (go-nvlib's MigProfileInfo.String), model recognition by
name, and the MIG capabilities of a process, without NVML."""

import pynvml
import pytest

from agent.backends.nvml.access import mig_access
from agent.backends.nvml.names import (
    GiProfile,
    match_profile,
    memory_gb,
    memory_slots,
    profile_name,
    shape,
    with_compute,
)
from agent.gpu_models import model_key


@pytest.mark.parametrize(
    ("mig_mib", "total_mib", "gb"),
    [
        (40192, 81920, 40),  # A100-80GB 3g.40gb: not round(40192 / 1024) = 39
        (9728, 81920, 10),  # 1g.10gb
        (19968, 81920, 20),  # 1g.20gb, 2g.20gb
        (81152, 81920, 80),  # 7g.80gb
        (40192, 81559, 40),  # H100 80GB HBM3: 80 GiB rounded up
        (70656, 143771, 71),  # H200 3g.71gb: 4/8 of 141 GiB is 70.5, rounded half up
        (4864, 40960, 5),  # A100-40GB 1g.5gb
    ],
)
def test_memory_in_names_follows_nvidia(mig_mib, total_mib, gb):
    assert memory_gb(mig_mib, total_mib) == gb


def test_memory_slots_are_eighths_rounded_up():
    assert [memory_slots(m, 81920) for m in (9728, 19968, 40192, 81152)] == [1, 2, 4, 8]


def test_names_of_profiles_and_compute_splits():
    assert profile_name(b"MIG 3g.40gb") == "3g.40gb"
    assert profile_name("MIG 1g.10gb+me") == "1g.10gb+me"
    assert profile_name(b"") is None
    assert with_compute("3g.40gb", 3, 1) == "1c.3g.40gb"
    assert with_compute("3g.40gb", 3, 3) == "3g.40gb"
    assert with_compute("3g.40gb", 3, None) == "3g.40gb"


def _profile(kind, slices, memory, name, engines=(0, 0, 0, 0)):
    return GiProfile(kind, kind + 100, slices, memory, name, 1, engines)


PLAIN_1G = _profile(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 1, 9728, "1g.10gb")
MEDIA_1G = _profile(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 9728, None, (1, 0, 1, 1))


def test_media_extension_profiles_are_told_apart_by_their_engines():
    profiles = [PLAIN_1G, MEDIA_1G]
    assert match_profile(profiles, 1, 9728, (1, 0, 1, 1)) is MEDIA_1G
    assert match_profile(profiles, 1, 9728, (0, 0, 0, 0)) is PLAIN_1G
    assert match_profile(profiles, 1, 9728, None) is PLAIN_1G  # the plain one when unsure
    assert match_profile(profiles, 2, 9728, None) is None


def test_shapes():
    media = shape(1, 1, 9728, MEDIA_1G, 81920)  # no name from NVML: the rule, with its suffix
    assert (media.name, media.slots, media.offered) == ("1g.10gb+me", 1, False)
    split = shape(3, 1, 40192, None, 81920)
    assert (split.name, split.compute, split.slots, split.offered) == ("1c.3g.40gb", 3, 4, False)
    unknown = shape(3, 3, 40192, None, None)  # nothing to name it from
    assert (unknown.name, unknown.slots, unknown.offered) == (None, None, True)


@pytest.mark.parametrize(
    ("name", "memory", "key"),
    [
        ("NVIDIA A100-SXM4-80GB", None, "a100-80gb"),
        ("NVIDIA A100 80GB PCIe", None, "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", None, "a100-sxm4-40gb"),  # states another size
        ("NVIDIA H100 80GB HBM3", None, "h100-80gb"),
        ("NVIDIA H200", None, "h200-141gb"),  # the only H200 the catalog has
        ("NVIDIA H200", 143771, "h200-141gb"),
        ("NVIDIA H100 NVL", 95830, "h100-nvl"),  # memory read: it decides
        ("NVIDIA L4", None, "l4"),
    ],
)
def test_models_are_recognised_by_name_when_memory_is_unknown(name, memory, key):
    assert model_key(name, memory) == key


def test_mig_capabilities_from_the_driver_files(tmp_path):
    proc, dev = tmp_path / "proc", tmp_path / "dev"
    proc.mkdir()
    dev.mkdir()
    (proc / "config").write_text("DeviceFileMinor: 1\nDeviceFileMode: 256\n")
    (proc / "monitor").write_text("DeviceFileMinor: 2\nDeviceFileMode: 292\n")
    (dev / "nvidia-cap2").write_text("")
    status = tmp_path / "status"
    status.write_text("Name:\tagent\nCapEff:\t0000000000000000\n")
    access = mig_access(proc, dev, status, euid=1000)
    assert (access.config, access.monitor) == (False, True)
    assert access.may("config") is False and access.may("monitor") is True
    assert "mig/monitor: yes, mig/config: no" in access.describe()

    status.write_text("CapEff:\t0000000000200000\n")  # bit 21: CAP_SYS_ADMIN
    assert mig_access(proc, dev, status, euid=1000).may("config") is True
    assert mig_access(tmp_path / "none", dev, status, euid=0).may("config") is True
    unknown = mig_access(tmp_path / "none", dev, tmp_path / "none", euid=1000)
    assert unknown.may("config") is None and "cannot tell" in unknown.describe()
