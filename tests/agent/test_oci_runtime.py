"""The `oci` runtime with real containers: limits the kernel enforces, exits and their reasons,
the volume at /workspace, isolation, logs, re-adoption after a restart. On Podman, and on Docker
too (BOTH_ENGINES) where the runtime does something of its own for each engine: the create
options, exits and their reasons (events, OOMKilled, the init's message), logs, the disk's
owner, a name already taken, a container removed behind the agent's back, exec."""

import contextlib
import os
import secrets
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import httpx
import pytest

from agent.devtools import engine as engine_module
from agent.devtools.engine import DEMO_IMAGE
from agent.runtimes.oci import OciRuntime
from agent.sessions import SessionGroup
from tests.agent.agents import wait_for
from tests.agent.fake_control_plane import HOST_ID, HOST_SECRET, FakeControlPlane
from tests.conftest import BOTH_ENGINES

pytestmark = pytest.mark.containers

IN_CGROUP = (
    "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max;"
    "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max;"
    "echo ready; sleep 1000"
)
MEMORY_HOG = "x=$(dd if=/dev/zero bs=1M count=256 | tr '\\0' a); echo survived"


def new_instance_id() -> str:
    return f"t{secrets.token_hex(4)}"


def launch_body(
    instance: str, command=None, *, gpu: int = 0, tenant: str = "1", **resources
) -> dict:
    return {
        "mode": "whole",
        "gpus": [gpu],
        "image": DEMO_IMAGE,
        "command": command,
        "resources": {"vcpus": 1, "memory_mib": 128, "pids": 64, **resources},
        "volume": {"name": f"gpucloud-{instance}", "size_gib": 1},
        "labels": {"instance": instance, "tenant": tenant, "name": "test", "spec": "t"},
    }


@pytest.fixture
def oci_agent(start_agent, oci_engine):
    def start(*args, **kwargs):
        return start_agent(
            "--gpus", "4", "--runtime", "oci", "--engine-url", oci_engine.url, *args, **kwargs
        )

    return start


@pytest.fixture
def engine(oci_engine):
    client = docker.DockerClient(base_url=oci_engine.url)
    yield client
    client.close()


def instance_logs(agent, instance: str) -> list[str]:
    return agent.client.get(f"/v1/instances/{instance}/logs", params={"tail": 50}).json()["lines"]


@pytest.fixture
def run_in(oci_engine):
    """Run a shell command in an instance's container, as an operator would."""

    def run(instance: str, command: str) -> subprocess.CompletedProcess:
        return oci_engine.cli("exec", f"gpucloud-{instance}", "sh", "-c", command)

    return run


@BOTH_ENGINES
def test_container_is_named_labelled_and_limited_by_the_kernel(oci_agent, engine):
    agent = oci_agent()
    instance = new_instance_id()
    created = agent.client.put(
        f"/v1/allocations/{instance}-a", json=launch_body(instance, ["sh", "-c", IN_CGROUP])
    ).json()
    assert created["state"] == "running", created
    assert created["container"] == f"gpucloud-{instance}"
    assert wait_for(lambda: "ready" in instance_logs(agent, instance))
    assert instance_logs(agent, instance)[:2] == [str(128 * 1024 * 1024), "64"]

    container = engine.containers.get(f"gpucloud-{instance}")
    assert container.labels["gpucloud.instance"] == instance
    assert container.labels["gpucloud.tenant"] == "1"
    assert container.labels["gpucloud.allocation"] == f"{instance}-a"
    host = container.attrs["HostConfig"]
    assert host["NanoCpus"] == 1_000_000_000
    assert host["MemorySwap"] == host["Memory"] == 128 * 1024 * 1024  # no swap beyond RAM
    assert "no-new-privileges" in " ".join(host["SecurityOpt"])
    assert "CAP_NET_RAW" in host["CapDrop"] or "NET_RAW" in host["CapDrop"]
    env = dict(line.split("=", 1) for line in container.attrs["Config"]["Env"])
    assert env["GPUCLOUD_CDI_DEVICES"] == f"nvidia.com/gpu={created['gpu_uuids'][0]}"
    assert env["CUDA_VISIBLE_DEVICES"] == created["gpu_uuids"][0]

    assert agent.client.delete(f"/v1/allocations/{instance}-a").status_code == 204
    assert not engine.containers.list(all=True, filters={"name": f"gpucloud-{instance}"})
    assert "ready" in instance_logs(agent, instance)  # kept after the container went


def test_nothing_of_the_agent_is_visible_inside(oci_agent, run_in):
    agent = oci_agent()
    instance = new_instance_id()
    agent.client.put(f"/v1/allocations/{instance}-a", json=launch_body(instance, ["sleep", "1000"]))
    seen = run_in(instance, f"env; ls {agent.state_dir} 2>&1; cat {agent.state_dir}/* 2>&1")
    assert "GPUCLOUD_TEST_AGENT_ONLY" not in seen.stdout
    assert "agent-test-secret" not in seen.stdout
    assert "No such file or directory" in seen.stdout
    agent.client.delete(f"/v1/allocations/{instance}-a")


@BOTH_ENGINES
def test_exit_codes_become_states_with_reasons_and_logs(oci_agent):
    agent = oci_agent()
    failing, done = new_instance_id(), new_instance_id()
    agent.client.put(
        f"/v1/allocations/{failing}-a", json=launch_body(failing, ["sh", "-c", "echo hi; exit 3"])
    )
    agent.client.put(f"/v1/allocations/{done}-a", json=launch_body(done, ["true"], gpu=1))
    failed = agent.wait_state(f"{failing}-a", "failed")
    assert failed["reason"] == "exit code 3" and failed["exit_code"] == 3
    assert failed["finished_at"]
    assert instance_logs(agent, failing) == ["hi"]
    exited = agent.wait_state(f"{done}-a", "exited")
    assert exited["reason"] == "exited" and exited["exit_code"] == 0


@BOTH_ENGINES
def test_a_memory_hog_is_oom_killed(oci_agent):
    agent = oci_agent()
    instance = new_instance_id()
    body = launch_body(instance, ["sh", "-c", MEMORY_HOG], memory_mib=32)
    agent.client.put(f"/v1/allocations/{instance}-a", json=body)
    failed = agent.wait_state(f"{instance}-a", "failed")
    assert failed["reason"] == "oom_killed", failed
    assert "survived" not in instance_logs(agent, instance)


@BOTH_ENGINES
def test_what_cannot_run_fails_with_a_reason_a_person_understands(oci_agent):
    agent = oci_agent()
    missing_command, missing_image = new_instance_id(), new_instance_id()
    agent.client.put(
        f"/v1/allocations/{missing_command}-a",
        json=launch_body(missing_command, ["no-such-program"]),
    )
    failed = agent.wait_state(f"{missing_command}-a", "failed")
    assert failed["reason"] == "command_not_found: no-such-program: not in the image"
    body = {**launch_body(missing_image, None, gpu=1), "image": "localhost/gpucloud/no-such:1"}
    answer = agent.client.put(f"/v1/allocations/{missing_image}-a", json=body).json()
    assert answer["state"] == "failed"
    assert answer["reason"].startswith(("image_not_found", "image_pull_failed")), answer


@BOTH_ENGINES
def test_workspace_survives_stop_and_start_until_the_instance_is_deleted(oci_agent, engine, run_in):
    agent = oci_agent()
    instance = new_instance_id()
    write = ["sh", "-c", "echo kept > /workspace/f; echo scratch > /tmp/g; sleep 1000"]
    agent.client.put(f"/v1/allocations/{instance}-a", json=launch_body(instance, write))
    wait_for(lambda: run_in(instance, "cat /workspace/f").stdout == "kept\n")
    assert agent.client.delete(f"/v1/allocations/{instance}-a").status_code == 204

    agent.client.put(f"/v1/allocations/{instance}-b", json=launch_body(instance, ["sleep", "1000"]))
    assert run_in(instance, "cat /workspace/f").stdout == "kept\n"
    assert run_in(instance, "cat /tmp/g").returncode != 0  # the rest of the container is new

    busy = agent.client.delete(f"/v1/instances/{instance}")
    assert busy.status_code == 409 and busy.json()["error"] == "instance_busy"
    agent.client.delete(f"/v1/allocations/{instance}-b")
    assert agent.client.delete(f"/v1/instances/{instance}").status_code == 204
    assert not (agent.state_dir / "disks" / f"gpucloud-{instance}").exists()
    assert instance_logs(agent, instance) == []


def test_two_tenants_see_neither_processes_nor_files_of_the_other(oci_agent, run_in):
    agent = oci_agent()
    mine, theirs = new_instance_id(), new_instance_id()
    secret = ["sh", "-c", "echo private > /workspace/secret; sleep 1000"]
    agent.client.put(f"/v1/allocations/{theirs}-a", json=launch_body(theirs, secret, tenant="2"))
    agent.client.put(f"/v1/allocations/{mine}-a", json=launch_body(mine, ["sleep", "999"], gpu=1))
    wait_for(lambda: run_in(theirs, "cat /workspace/secret").stdout == "private\n")
    processes = run_in(mine, "ps -o args").stdout
    assert "sleep 999" in processes and "sleep 1000" not in processes
    found = run_in(mine, "ls -R / 2>/dev/null | grep -c '^secret$'").stdout.strip()
    assert found == "0"


@BOTH_ENGINES
def test_a_container_removed_behind_the_agents_back_is_lost(oci_agent, engine):
    agent = oci_agent()
    instance = new_instance_id()
    agent.client.put(f"/v1/allocations/{instance}-a", json=launch_body(instance, ["sleep", "1000"]))
    # Podman may answer "…/shm: device or resource busy" for a container in a user namespace
    # of its own, and remove it all the same
    with contextlib.suppress(docker.errors.APIError):
        engine.containers.get(f"gpucloud-{instance}").remove(force=True)
    failed = agent.wait_state(f"{instance}-a", "failed")
    assert failed["reason"] == "container_lost"


def test_a_restarted_agent_readopts_its_containers(oci_agent, engine):
    agent = oci_agent()
    instance = new_instance_id()
    agent.client.put(f"/v1/allocations/{instance}-a", json=launch_body(instance, ["sleep", "1000"]))
    started = engine.containers.get(f"gpucloud-{instance}").attrs["State"]["StartedAt"]
    agent.kill()
    again = oci_agent(state_dir=agent.state_dir)
    assert again.allocation(f"{instance}-a")["state"] == "running"
    container = engine.containers.get(f"gpucloud-{instance}")
    assert container.attrs["State"]["StartedAt"] == started  # the same container, not a new one
    stopped = again.client.post(f"/v1/allocations/{instance}-a/stop").json()
    assert stopped["state"] == "stopped"


@BOTH_ENGINES
def test_an_exec_runs_in_the_container_and_its_host_pid_is_known(
    oci_agent, oci_engine, engine, tmp_path
):
    """What a session's clean-up needs (agent/shell.py): the exec's process on the host, held
    at its gate until it is in a cgroup of its own (agent/sessions.py), under the container's."""
    agent = oci_agent()
    instance = new_instance_id()
    agent.client.put(f"/v1/allocations/{instance}-a", json=launch_body(instance, ["sleep", "1000"]))
    container = engine.containers.get(f"gpucloud-{instance}")
    runtime = OciRuntime(oci_engine.url, tmp_path / "logs", 1, install="exec")
    exec_id, stream = runtime.exec_open(container, ["sleep", "77"], False, {})
    pid = wait_for(lambda: runtime.exec_pid(exec_id))
    group = SessionGroup.enter(pid, container.attrs["State"]["Pid"])
    try:
        assert wait_for(lambda: Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x0077\x00")
        init = container.attrs["State"]["Pid"]
        assert os.readlink(f"/proc/{pid}/ns/pid") == os.readlink(f"/proc/{init}/ns/pid")
        assert os.readlink(f"/proc/{pid}/ns/user") == os.readlink(f"/proc/{init}/ns/user")
        cgroups = [Path(f"/proc/{p}/cgroup").read_text().splitlines()[-1] for p in (init, pid)]
        assert cgroups[1] == f"{cgroups[0]}/{group.path.name}"
    finally:
        group.kill()
        stream.close()
    assert wait_for(lambda: runtime.exec_exit_code(exec_id) is not None)
    assert wait_for(lambda: not group.populated())
    group.remove()
    agent.client.delete(f"/v1/allocations/{instance}-a")


@BOTH_ENGINES
def test_a_launch_sent_again_makes_no_second_container(oci_agent, engine):
    """The console re-sends a launch (a redelivered task, reconcile re-driving it, two at
    once): the agent answers the same allocation, one container, started once."""
    agent = oci_agent()
    instance = new_instance_id()
    body = launch_body(instance, ["sleep", "1000"])
    url = f"{agent.client.base_url}/v1/allocations/{instance}-a"
    headers = dict(agent.client.headers)
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: httpx.put(url, json=body, headers=headers), range(3)))
    assert sorted(answer.status_code for answer in answers) == [200, 200, 201]
    assert len({answer.json()["container"] for answer in answers}) == 1
    agent.kill()
    again = oci_agent(state_dir=agent.state_dir)  # and after a restart
    assert again.client.put(f"/v1/allocations/{instance}-a", json=body).status_code == 200
    containers = engine.containers.list(
        all=True, filters={"label": f"gpucloud.instance={instance}"}
    )
    assert [c.name for c in containers] == [f"gpucloud-{instance}"]
    again.client.delete(f"/v1/allocations/{instance}-a")


def test_an_exit_reaches_the_console_at_once(oci_agent):
    instance = new_instance_id()
    with FakeControlPlane() as server:
        agent = oci_agent("--server", server.url, "--join-token", "join-oci", secret=None)
        client = agent.client_with(HOST_SECRET)
        client.put(
            f"/v1/allocations/{instance}-a",
            json=launch_body(instance, ["sh", "-c", "sleep 1; exit 7"]),
        )
        sent = wait_for(lambda: [b for _, b in server.received("events") if b["events"]])
    body = sent[0]
    assert body["host_id"] == HOST_ID
    (event,) = body["events"]
    assert event["allocation"] == f"{instance}-a" and event["instance"] == instance
    assert (event["kind"], event["state"], event["reason"]) == ("state", "failed", "exit code 7")
    assert event["exit_code"] == 7 and event["at"]


def test_an_engine_that_went_away_fails_the_launch_and_keeps_nothing(
    start_agent, container_engine, tmp_path
):
    own = engine_module.start_podman_service(
        tmp_path / "own.sock", tmp_path / "own.log", container_engine.storage
    )
    agent = start_agent(
        "--gpus", "2", "--runtime", "oci", "--engine-url", f"unix://{tmp_path / 'own.sock'}"
    )  # fmt: skip
    own.terminate()
    own.wait(10)
    instance = new_instance_id()
    answer = agent.client.put(f"/v1/allocations/{instance}-a", json=launch_body(instance, ["true"]))
    failed = answer.json()
    assert failed["state"] == "failed", failed
    assert failed["reason"].startswith("engine_unavailable"), failed["reason"]
    assert agent.client.delete(f"/v1/allocations/{instance}-a").status_code == 204
