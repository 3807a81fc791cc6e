"""A shared fraction's GPU limits are set where its tenant cannot touch them: through the MPS
control daemon of the fraction (tests/fake_mps_control.py stands in for NVIDIA's), before its
container exists, never in the container's environment; the container sees the daemon's client
socket and nothing else of its pipe directory."""

import stat
import time

import docker
import pytest

from agent.allocations import Allocation, cuda_env
from agent.devtools.engine import DEMO_IMAGE
from agent.mps import CLIENT_PIPE, MpsDaemons
from agent.runtimes import LaunchError
from agent.runtimes.oci import OciRuntime

GPU = "GPU-aaaa"


def _alloc(alloc_id: str, milli: int, memory_mib: int, instance: str = "7") -> Allocation:
    spec = {"mode": "shared", "gpus": [0], "mig": None,
            "shared": {"milli": milli, "memory_mib": memory_mib}, "command": None, "env": {},
            "labels": {"instance": instance, "tenant": "1"}, "sim": None, "image": DEMO_IMAGE,
            "resources": None, "volume": None}  # fmt: skip
    return Allocation(
        id=alloc_id, spec=spec, gpu_uuids=[GPU], mig_uuid=None, env=cuda_env(spec, [GPU], None),
        state="starting", created_at="", updated_at="",
    )  # fmt: skip


def _calls(calls) -> list[tuple[str, str, str]]:
    return [tuple(line.split(" ", 2)) for line in calls.read_text().splitlines()]


@pytest.mark.integration
def test_each_fraction_has_a_daemon_whose_servers_get_its_limits(tmp_path, fake_mps_control):
    daemons = MpsDaemons(tmp_path / "mps")
    eighth, half = _alloc("a-1", 125, 11517), _alloc("a-2", 500, 40960)
    volume = daemons.start(eighth)
    daemons.start(half)

    pipe1, pipe2 = tmp_path / "mps" / "a-1" / "pipe", tmp_path / "mps" / "a-2" / "pipe"
    assert _calls(fake_mps_control) == [
        (str(pipe1), GPU, "start"),
        (str(pipe1), GPU, "set_default_active_thread_percentage 13"),  # 12.5 %, rounded up
        (str(pipe1), GPU, "set_default_device_pinned_mem_limit 0 11517M"),
        (str(pipe2), GPU, "start"),
        (str(pipe2), GPU, "set_default_active_thread_percentage 50"),
        (str(pipe2), GPU, "set_default_device_pinned_mem_limit 0 40960M"),
    ]
    # the container gets the client socket alone, at CUDA's default pipe directory
    assert volume == {str(pipe1 / "control"): {"bind": f"{CLIENT_PIPE}/control", "mode": "ro"}}
    assert stat.S_ISSOCK((pipe1 / "control_privileged").stat().st_mode)
    # the limits are nowhere in the environment
    assert not [name for name in eighth.env if name.startswith("CUDA_MPS_")]

    daemons.stop(eighth)  # the one daemon ends; the other fraction's goes on
    assert _calls(fake_mps_control)[-1] == (str(pipe1), GPU, "quit")
    assert not (tmp_path / "mps" / "a-1").exists()
    assert (pipe2 / "control").exists()
    daemons.stop(eighth)  # again: nothing to do
    assert len(_calls(fake_mps_control)) == 7


@pytest.mark.integration
def test_a_daemon_left_by_an_earlier_launch_is_ended_first(tmp_path, fake_mps_control):
    daemons = MpsDaemons(tmp_path / "mps")
    alloc = _alloc("a-1", 250, 20480)
    daemons.start(alloc)
    daemons.start(alloc)
    commands = [what for _, _, what in _calls(fake_mps_control)]
    assert commands[3:] == [
        "quit",
        "start",
        "set_default_active_thread_percentage 25",
        "set_default_device_pinned_mem_limit 0 20480M",
    ]


@pytest.mark.integration
def test_no_server_runs_without_its_limits(tmp_path, fake_mps_control):
    fake_mps_control.with_name("calls.fail").write_text(
        "set_default_device_pinned_mem_limit 0 20480M\n"
    )
    daemons = MpsDaemons(tmp_path / "mps")
    with pytest.raises(LaunchError, match="set_default_device_pinned_mem_limit.*Invalid command"):
        daemons.start(_alloc("a-1", 250, 20480))
    assert [what for _, _, what in _calls(fake_mps_control)][-1] == "quit"
    assert not (tmp_path / "mps" / "a-1" / "pipe" / "control").exists()


def test_a_host_without_mps_fails_the_launch_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LaunchError, match="nvidia-cuda-mps-control is not installed"):
        MpsDaemons(tmp_path / "mps").start(_alloc("a-1", 250, 20480))


SHOW = (
    "ls -a /tmp/nvidia-mps | tr '\\n' ' '; echo;"
    "test -S /tmp/nvidia-mps/control && echo client-socket;"
    "env | sort; echo shown; sleep 1000"
)


@pytest.mark.integration
@pytest.mark.containers
def test_the_container_sees_the_client_socket_and_no_limit(
    container_engine, tmp_path, fake_mps_control
):
    runtime = OciRuntime(
        container_engine.url, tmp_path / "logs", 1, install="5ec0717e", mps_dir=tmp_path / "mps"
    )
    alloc = _alloc("mps-1", 250, 20480, instance=f"mps{time.monotonic_ns()}")
    env = {"HF_HOME": "/workspace/hf", **alloc.env, "GPUCLOUD_ALLOCATION_ID": alloc.id}
    client = docker.DockerClient(base_url=container_engine.url)
    try:
        runtime.launch(alloc, ["sh", "-c", SHOW], env, lambda message: None)
        container = client.containers.get(alloc.container)
        for _ in range(100):
            output = container.logs().decode()
            if "shown" in output:
                break
            time.sleep(0.1)
        lines = output.splitlines()
        assert lines[0].split() == [".", "..", "control"]  # no control_privileged, log, pid
        assert lines[1] == "client-socket"
        assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in lines
        assert not [line for line in lines if line.startswith(("CUDA_MPS_ACTIVE", "CUDA_MPS_PIN"))]
        commands = [what for _, _, what in _calls(fake_mps_control)]
        assert commands == [
            "start",
            "set_default_active_thread_percentage 25",
            "set_default_device_pinned_mem_limit 0 20480M",
        ]

        runtime._stop(alloc)  # the container stops, then its daemon ends
        assert [what for _, _, what in _calls(fake_mps_control)][-1] == "quit"
        assert not (tmp_path / "mps" / "mps-1").exists()
    finally:
        runtime.remove(alloc)
        runtime.delete_instance(alloc.instance)
        client.close()
