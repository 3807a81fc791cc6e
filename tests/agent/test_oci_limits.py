"""A live resize on the agent: PUT /v1/allocations/{id}/limits changes a running container's
CPU, memory and pids limits in place (the kernel's cgroup says so) and the workload goes on:
same container, same process, same start. On Podman (its own update call) and Docker."""

import os

import pytest

from agent.runtimes.oci import cpu_limit
from tests.agent import test_oci_runtime as runtime
from tests.conftest import BOTH_ENGINES

pytestmark = pytest.mark.containers
# the runtime tests' fixtures and request bodies
oci_agent, run_in, _body, _instance = (
    runtime.oci_agent,
    runtime.run_in,
    runtime.launch_body,
    runtime.new_instance_id,
)

LIMITS = (
    "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max;"
    "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max;"
    "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cut -d' ' -f1 /sys/fs/cgroup/cpu.max"
)
# the workload: one process that keeps a file it wrote once, so a restart would show
WORKLOAD = ["sh", "-c", "echo $$ > /tmp/started; sleep 1000"]


def _limits(run_in, instance: str) -> list[str]:
    return run_in(instance, LIMITS).stdout.split()


def _started(oci_engine, instance: str) -> str:
    return oci_engine.cli(
        "inspect", "--format", "{{.Id}} {{.State.Pid}} {{.State.StartedAt}}", f"gpucloud-{instance}"
    ).stdout.strip()


@BOTH_ENGINES
def test_limits_change_while_the_workload_runs_on(oci_agent, oci_engine, run_in):
    agent = oci_agent()
    instance = _instance()
    url = f"/v1/allocations/{instance}-a"
    created = agent.client.put(url, json=_body(instance, WORKLOAD))
    assert created.json()["state"] == "running", created.text
    assert _limits(run_in, instance) == [str(128 * 1024 * 1024), "64", "100000"]
    before = _started(oci_engine, instance)
    first_pid = run_in(instance, "cat /tmp/started").stdout

    changed = agent.client.put(
        f"{url}/limits", json={"resources": {"vcpus": 2, "memory_mib": 256, "pids": 128}}
    )

    assert changed.status_code == 200, changed.text
    assert changed.json()["state"] == "running"
    assert _limits(run_in, instance) == [str(256 * 1024 * 1024), "128", "200000"]
    assert _started(oci_engine, instance) == before  # same container, process and start
    assert run_in(instance, "cat /tmp/started").stdout == first_pid
    assert agent.client.get("/v1/allocations").json()["allocations"][0]["state"] == "running"
    agent.client.delete(url)


def test_limits_are_checked_and_kept_for_the_next_start(oci_agent, run_in):
    agent = oci_agent()
    instance = _instance()
    url = f"/v1/allocations/{instance}-a"
    agent.client.put(url, json=_body(instance, WORKLOAD))

    bad = agent.client.put(f"{url}/limits", json={"resources": {"memory_mib": 1, "gpus": 2}})
    assert bad.status_code == 400 and "gpus" in bad.json()["detail"]
    missing = agent.client.put("/v1/allocations/nope/limits", json={"resources": {}})
    assert missing.status_code == 404

    agent.client.put(f"{url}/limits", json={"resources": {"vcpus": 1, "memory_mib": 192}})
    rebooted = agent.client.post(f"{url}/reboot")
    assert rebooted.json()["state"] == "running"
    assert _limits(run_in, instance)[0] == str(192 * 1024 * 1024)  # the new container's too
    agent.client.delete(url)


@BOTH_ENGINES
def test_more_vcpus_than_the_machine_has_are_capped_at_its_cpus(oci_agent, run_in):
    """A demo's simulated GPUs offer 16 vCPUs each: Docker refuses a CPU limit above the
    machine's CPUs, so the agent asks for at most those, on both engines, and says so."""
    agent = oci_agent()
    instance = _instance()
    url = f"/v1/allocations/{instance}-a"
    machine = os.cpu_count()
    created = agent.client.put(url, json=_body(instance, WORKLOAD, vcpus=machine + 14))
    assert created.json()["state"] == "running", created.text
    assert _limits(run_in, instance)[2] == str(machine * 100_000)
    resized = agent.client.put(
        f"{url}/limits", json={"resources": {"vcpus": machine + 30, "memory_mib": 128}}
    )
    assert resized.status_code == 200, resized.text
    assert _limits(run_in, instance)[2] == str(machine * 100_000)
    agent.client.delete(url)


def test_a_cpu_limit_is_what_was_asked_up_to_the_machines_cpus():
    assert cpu_limit(2, 8) == (2, "")
    assert cpu_limit(8, 8) == (8, "")
    limit, note = cpu_limit(16, 2)
    assert limit == 2
    assert note == (
        "its 16 vCPUs are capped at this machine's 2 CPUs: the engine cannot give a container more"
    )
