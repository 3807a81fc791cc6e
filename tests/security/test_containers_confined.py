"""What a container can take of its host, with real containers through the real agent: its root
is an unprivileged host user (a user namespace of its own), its disk is a fixed size, its log
is capped and read from its end, and its pids limit is sized against the host's. On Podman,
and on Docker (BOTH_ENGINES) for what each does its own way: user namespaces, logs, limits."""

import contextlib
import os
import re
import time
from pathlib import Path

import docker
import pytest
from docker.errors import DockerException

from agent.runtimes import oci
from agent.runtimes.oci import OciRuntime, pids_ceiling
from agent.runtimes.output import KEPT_LOG_BYTES
from tests.agent.agents import SECRET, Agent, wait_for
from tests.agent.test_oci_runtime import instance_logs, launch_body, new_instance_id
from tests.conftest import BOTH_ENGINES

pytestmark = [pytest.mark.integration, pytest.mark.containers]
HOST_IDENTITY = "0 0 4294967295"
LOG_CAP = 8 * 1024 * 1024
# 50 MB of output in lines, then a 20 MB line without a newline (Podman's API read such a line
# whole into its memory for `tail`), then the last line
FLOOD = (
    "yes 0123456789012345678901234567890123456789012345678901234567890123456789 "
    "| head -c 50000000; head -c 20000000 /dev/zero | tr '\\0' a; echo; echo done; sleep 1000"
)


@contextlib.contextmanager
def running_agent(container_engine, state_dir: Path):
    """An `oci` agent with 4 GPUs; what its instances left (containers, disks) goes after."""
    args = ("--gpus", "4", "--runtime", "oci", "--engine-url", container_engine.url)
    running = Agent(state_dir, args, SECRET)
    try:
        running.wait_ready()
        yield running
        allocations = running.client.get("/v1/allocations").json()["allocations"]
        for alloc in allocations:
            running.client.delete(f"/v1/allocations/{alloc['id']}")
        for instance in {alloc["labels"]["instance"] for alloc in allocations}:
            running.client.delete(f"/v1/instances/{instance}")
    finally:
        running.kill()
        running.client.close()


@pytest.fixture
def agent(oci_engine, tmp_path):
    with running_agent(oci_engine, tmp_path / "state") as running:
        yield running


@pytest.fixture
def engine(oci_engine):
    client = docker.DockerClient(base_url=oci_engine.url)
    yield client
    client.close()


def _run(agent, instance: str, command: str, **resources) -> dict:
    body = launch_body(instance, ["sh", "-c", command], **resources)
    answer = agent.client.put(f"/v1/allocations/{instance}-a", json=body).json()
    assert answer["state"] == "running", answer
    return answer


def _uid_map(engine, instance: str) -> str:
    pid = engine.containers.get(f"gpucloud-{instance}").attrs["State"]["Pid"]
    return " ".join(Path(f"/proc/{pid}/uid_map").read_text().split())


def _in(container_engine, instance: str, command: str):
    return container_engine.cli("exec", f"gpucloud-{instance}", "sh", "-c", command)


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])


def _engine_pid(container_engine) -> int:
    socket = container_engine.url.removeprefix("unix://")
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            engine = b"service" in command or command[0].endswith(b"dockerd")
            if engine and f"unix://{socket}".encode() in command:
                return int(entry.name)
    raise AssertionError("the engine's service is not running")


@BOTH_ENGINES
def test_each_container_has_a_user_namespace_of_its_own(agent, engine, oci_engine):
    first, second = new_instance_id(), new_instance_id()
    _run(agent, first, "sleep 1000")
    _run(agent, second, "sleep 1000", gpu=1)

    maps = [_uid_map(engine, first), _uid_map(engine, second)]
    assert HOST_IDENTITY not in maps
    (inside, host_first, size), (_, host_second, _) = (m.split() for m in maps)
    assert inside == "0" and int(host_first) > 0 and int(size) >= 65536
    if "Podman" in str(engine.version()):
        assert host_first != host_second  # ranges of their own
    else:  # Docker's userns-remap: one range, the daemon's, for all its containers
        assert host_first == host_second

    made = _in(oci_engine, first, "touch /workspace/f && stat -c %u /workspace/f")
    assert made.returncode == 0, made.stderr  # the container's root may write its workspace
    assert made.stdout.strip() == "0"
    disk = agent.state_dir / "disks" / f"gpucloud-{first}" / "mnt"
    assert (disk / "f").stat().st_uid == int(host_first)  # an unprivileged user out here


def test_a_write_past_the_disk_size_fails_inside_and_changes_nothing_outside(
    agent, container_engine
):
    instance = new_instance_id()
    _run(agent, instance, "sleep 1000")  # a 1 GiB disk
    filled = _in(container_engine, instance, "dd if=/dev/zero of=/workspace/big bs=1M count=1100")
    assert filled.returncode != 0
    assert "No space left on device" in filled.stderr
    disk = agent.state_dir / "disks" / f"gpucloud-{instance}"
    assert (disk / "disk.img").stat().st_blocks * 512 <= 1024**3  # what it took of the host
    mounted = os.statvfs(disk / "mnt")
    assert 0.9 * 1024**3 < mounted.f_blocks * mounted.f_frsize <= 1024**3
    assert mounted.f_bavail < 1024**2 // mounted.f_frsize  # full


def _used(folder: Path) -> int:
    stat = os.statvfs(folder)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


@BOTH_ENGINES
def test_a_write_past_the_layer_size_fails_inside_and_changes_nothing_outside(
    agent, engine, oci_engine
):
    instance = new_instance_id()
    before = _used(oci_engine.storage)
    _run(agent, instance, "sleep 1000", layer_gib=1)
    filled = _in(
        oci_engine, instance, "dd if=/dev/zero of=/big bs=1M count=1300; rc=$?; sync; exit $rc"
    )
    assert filled.returncode != 0
    assert re.search("No space left on device|Disk quota exceeded", filled.stderr), filled.stderr
    # what the container's own file system took of the engine's storage: at most its size
    assert _used(oci_engine.storage) - before < 1024**3 + 100 * 1024**2
    written = _in(oci_engine, instance, "wc -c < /big")
    assert 0.8 * 1024**3 < int(written.stdout) <= 1024**3


def test_an_engine_that_cannot_bound_layers_is_refused_unless_allowed(caplog):
    oci.decide_layers(True, False, "")
    with pytest.raises(DockerException, match="--unbounded-layers"):
        oci.decide_layers(False, False, "overlay on ext4")
    oci.decide_layers(False, True, "overlay on ext4")
    assert "NOT bounded" in caplog.text


def test_the_agent_refuses_an_engine_without_layer_bounds(container_engine, tmp_path, monkeypatch):
    monkeypatch.setattr(OciRuntime, "_probe_layers", lambda self: "overlay on ext4")
    with pytest.raises(DockerException, match="writable layer"):
        OciRuntime(container_engine.url, tmp_path / "logs", 1, install="t")
    allowed = OciRuntime(
        container_engine.url, tmp_path / "logs", 1, install="t", unbounded_layers=True
    )
    assert allowed.layers_bounded is False
    allowed.client.close()


@BOTH_ENGINES
def test_a_flood_of_output_leaves_a_capped_log_read_from_its_end(agent, engine, oci_engine):
    instance = new_instance_id()
    _run(agent, instance, FLOOD)
    container = engine.containers.get(f"gpucloud-{instance}")
    log_file = Path(container.attrs["LogPath"])
    wait_for(lambda: instance_logs(agent, instance)[-1:] == ["done"], timeout=60)
    assert log_file.stat().st_size <= LOG_CAP + 64 * 1024

    service = _engine_pid(oci_engine)
    before = _rss_kib(service)
    started = time.monotonic()
    for tail in (1, 2, 3):
        answer = agent.client.get(f"/v1/instances/{instance}/logs", params={"tail": tail})
        assert answer.json()["lines"][-1] == "done"
    assert time.monotonic() - started < 3
    assert _rss_kib(service) - before < 50 * 1024  # the engine read none of it

    assert agent.client.delete(f"/v1/allocations/{instance}-a").status_code == 204
    kept = agent.state_dir / "logs" / f"instance-{instance}.log"
    assert 0 < kept.stat().st_size <= KEPT_LOG_BYTES
    assert instance_logs(agent, instance)[-1] == "done"


@BOTH_ENGINES
def test_the_pids_limit_is_the_request_up_to_the_hosts_share(agent, engine):
    host = min(int(Path(f"/proc/sys/kernel/{n}").read_text()) for n in ("pid_max", "threads-max"))
    ceiling = pids_ceiling(oci.CONTAINERS_PER_GPU * 4)  # the agent's 4 GPUs' containers
    assert ceiling == max(oci.PIDS_FLOOR, host // 2 // (oci.CONTAINERS_PER_GPU * 4))
    modest, greedy = new_instance_id(), new_instance_id()
    _run(agent, modest, "sleep 1000", pids=64)
    _run(agent, greedy, "sleep 1000", gpu=1, pids=10 * ceiling)
    limits = [
        engine.containers.get(f"gpucloud-{name}").attrs["HostConfig"]["PidsLimit"]
        for name in (modest, greedy)
    ]
    assert limits == [64, ceiling]


def test_podman_without_a_containers_id_range_is_refused(container_engine, tmp_path, monkeypatch):
    empty = tmp_path / "subuid"
    empty.write_text(f"{os.environ.get('USER', 'root')}:100000:65536\n")
    monkeypatch.setattr(oci, "SUBID_FILES", (empty, empty))
    with pytest.raises(DockerException, match="containers"):
        OciRuntime(container_engine.url, tmp_path / "logs", 1, install="t")


def test_docker_without_user_namespaces_is_refused(docker_engine, tmp_path, monkeypatch):
    info = docker.DockerClient.info

    def without_userns(client):
        return {**info(client), "SecurityOptions": ["name=seccomp"]}

    monkeypatch.setattr(docker.DockerClient, "info", without_userns)
    with pytest.raises(DockerException, match="userns-remap"):
        OciRuntime(docker_engine.url, tmp_path / "logs", 1, install="t")
