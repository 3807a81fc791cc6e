"""How the oci runtime hands GPUs to a container on a host with real GPUs: CDI device names (or,
on a Docker without CDI, device requests for the NVIDIA runtime), and
one CUDA MPS control daemon per shared fraction, whose client socket its container gets (the
daemon itself: tests/security/test_mps_limits.py)."""

import pytest

from agent.allocations import Allocation
from agent.devtools.engine import DEMO_IMAGE
from agent.mps import CLIENT_PIPE
from agent.runtimes.oci import OciRuntime, gpu_path

pytestmark = pytest.mark.containers


def _alloc(mode: str, mig_uuid: str | None = None) -> Allocation:
    shared = {"milli": 250, "memory_mib": 20480} if mode == "shared" else None
    spec = {"mode": mode, "gpus": [0], "mig": None, "shared": shared, "command": None, "env": {},
            "labels": {"instance": "7"}, "sim": None, "image": "x", "resources": None,
            "volume": None}  # fmt: skip
    return Allocation(
        id="a-1", spec=spec, gpu_uuids=["GPU-aaaa"], mig_uuid=mig_uuid, env={},
        state="running", created_at="", updated_at="",
    )  # fmt: skip


def test_real_gpus_are_cdi_devices_and_fractions_get_the_mps_client_socket(
    container_engine, tmp_path, fake_mps_control
):
    runtime = OciRuntime(
        container_engine.url,
        tmp_path / "logs",
        1,
        install="5ec0717e",
        cdi=True,
        mps_dir=tmp_path / "mps",
    )
    env: dict[str, str] = {}
    whole = runtime._gpu_options(_alloc("whole"), env)
    assert whole == {"devices": ["nvidia.com/gpu=GPU-aaaa"]}  # Podman takes CDI names here
    mig = runtime._gpu_options(_alloc("mig", mig_uuid="MIG-1234"), env)
    assert mig == {"devices": ["nvidia.com/gpu=MIG-1234"]}  # only the MIG device, not its GPU
    assert env == {"NVIDIA_VISIBLE_DEVICES": "void"}  # no GPU but these, whatever the image says

    shared = runtime._gpu_options(_alloc("shared"), env)
    control = str(tmp_path / "mps" / "a-1" / "pipe" / "control")
    assert shared["devices"] == ["nvidia.com/gpu=GPU-aaaa"]
    assert shared["volumes_extra"] == {control: {"bind": f"{CLIENT_PIPE}/control", "mode": "ro"}}
    assert env == {"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_MPS_PIPE_DIRECTORY": CLIENT_PIPE}


def test_gpus_go_as_cdi_devices_where_the_engine_takes_them_else_to_the_nvidia_runtime():
    assert gpu_path("podman", {}) == "cdi"
    assert gpu_path("docker", {"CDISpecDirs": ["/etc/cdi", "/var/run/cdi"]}) == "cdi"  # 27+
    assert gpu_path("docker", {"CDISpecDirs": []}) == "nvidia"  # its CDI feature is off
    assert gpu_path("docker", {}) == "nvidia"  # before 27: no CDISpecDirs


def test_docker_without_cdi_gets_device_requests_for_the_nvidia_runtime(docker_engine, tmp_path):
    runtime = OciRuntime(docker_engine.url, tmp_path / "logs", 1, install="5ec0717f", cdi=True)
    assert runtime.gpu_path == "nvidia"  # Debian's Docker 20.10 has no CDI
    env: dict[str, str] = {}
    options = runtime._gpu_options(_alloc("mig", mig_uuid="MIG-1234"), env)
    assert env == {"NVIDIA_VISIBLE_DEVICES": "MIG-1234"}  # the same as the request's
    container = runtime.client.containers.create(DEMO_IMAGE, ["true"], **options)
    try:
        (request,) = container.attrs["HostConfig"]["DeviceRequests"]
        assert request["Driver"] == "nvidia" and request["DeviceIDs"] == ["MIG-1234"]
        assert request["Capabilities"] == [["gpu"]]
    finally:
        container.remove(force=True)
