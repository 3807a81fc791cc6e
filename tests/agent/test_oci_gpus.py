"""How the oci runtime hands GPUs to a container on a host with real GPUs: CDI device names, and
one CUDA MPS control daemon per shared GPU whose pipe the fraction's containers get."""

import os
import stat

import pytest

from agent.allocations import Allocation
from agent.oci import MpsDaemons, OciRuntime
from agent.runtime import LaunchError

pytestmark = pytest.mark.containers

FAKE_CONTROL = """#!/bin/sh
echo "$CUDA_VISIBLE_DEVICES $CUDA_MPS_PIPE_DIRECTORY $*" >> "$(dirname "$0")/calls"
touch "$CUDA_MPS_PIPE_DIRECTORY/control"
"""


@pytest.fixture
def mps_control(tmp_path, monkeypatch):
    """A stand-in `nvidia-cuda-mps-control` on PATH that records how it was started."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(FAKE_CONTROL)
    control.chmod(control.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir / "calls"


def _alloc(mode: str, mig_uuid: str | None = None) -> Allocation:
    spec = {"mode": mode, "gpus": [0], "mig": None, "shared": None, "command": None, "env": {},
            "labels": {"instance": "7"}, "sim": None, "image": "x", "resources": None,
            "volume": None}  # fmt: skip
    return Allocation(
        id="a-1", spec=spec, gpu_uuids=["GPU-aaaa"], mig_uuid=mig_uuid, env={},
        state="running", created_at="", updated_at="",
    )  # fmt: skip


def test_one_mps_daemon_per_shared_gpu(tmp_path, mps_control):
    daemons = MpsDaemons(tmp_path / "mps")
    pipe = daemons.ensure("GPU-aaaa")
    assert pipe == tmp_path / "mps" / "GPU-aaaa" / "pipe"
    assert daemons.ensure("GPU-aaaa") == pipe  # running: not started again
    daemons.ensure("GPU-bbbb")
    calls = mps_control.read_text().splitlines()
    assert calls == [f"GPU-aaaa {pipe} -d", f"GPU-bbbb {tmp_path / 'mps' / 'GPU-bbbb' / 'pipe'} -d"]


def test_a_host_without_mps_fails_the_launch_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LaunchError, match="nvidia-cuda-mps-control is not installed"):
        MpsDaemons(tmp_path / "mps").ensure("GPU-aaaa")


def test_real_gpus_are_cdi_devices_and_fractions_get_the_mps_pipe(
    container_engine, tmp_path, mps_control
):
    runtime = OciRuntime(
        container_engine.url, tmp_path / "logs", 1, cdi=True, mps_dir=tmp_path / "mps"
    )
    env: dict[str, str] = {}
    whole = runtime._gpu_options(_alloc("whole"), env)
    assert whole == {"devices": ["nvidia.com/gpu=GPU-aaaa"]}  # Podman takes CDI names here
    mig = runtime._gpu_options(_alloc("mig", mig_uuid="MIG-1234"), env)
    assert mig == {"devices": ["nvidia.com/gpu=MIG-1234"]}  # only the MIG device, not its GPU
    assert env == {}

    shared = runtime._gpu_options(_alloc("shared"), env)
    pipe = str(tmp_path / "mps" / "GPU-aaaa" / "pipe")
    assert shared["devices"] == ["nvidia.com/gpu=GPU-aaaa"]
    assert shared["volumes_extra"] == {pipe: {"bind": pipe, "mode": "rw"}}
    assert env == {"CUDA_MPS_PIPE_DIRECTORY": pipe}
