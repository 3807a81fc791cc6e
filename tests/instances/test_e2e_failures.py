"""When things break, with the real stack and real agents: an agent that stays down, a host
that goes silent and comes back, a worker killed in the middle of a host call."""

import os
import signal
import time

import pytest

from console.fleet import services as fleet
from console.fleet.models import Host
from console.instances import recovery, tasks
from console.instances.models import GpuClaim, Instance, State
from tests.instances.e2e import (
    agent_allocations,
    api_client,
    make_catalog,
    make_tenant,
    start_agent,
    wait_for,
    wait_state,
)

pytestmark = [pytest.mark.integration]
LAUNCH = {"spec": "a100-quarter", "image": "pytorch-2.5-cuda12.4"}


def test_agent_down_then_host_silent_then_back(stack, settings):
    make_catalog()
    _, membership = make_tenant()
    agent, host = start_agent(stack, "gpu-1", gpus=1, mode="shared")
    api = api_client(stack, membership)
    first = api.post("/instances/", json={"name": "first", **LAUNCH}).json()
    wait_state(api, first["id"], "running", stack)
    held = list(agent_allocations(host))
    ran_at = Instance.objects.get(pk=first["id"]).events.get(to_state=State.RUNNING).at
    wait_for(
        lambda: Host.objects.get(pk=host.pk).last_heartbeat_at > ran_at,
        what="a heartbeat while it runs",
        stack=stack,
    )

    # the agent dies: a launch placed on it is retried, then waits for its host, saying so
    agent.kill()
    second = api.post("/instances/", json={"name": "second", **LAUNCH}).json()
    assert second["state"] == "provisioning"
    waiting = wait_for(
        lambda: (
            (r := api.get(f"/instances/{second['id']}/").json())["state_reason"].startswith(
                "Waiting for its host gpu-1"
            )
            and r
        ),
        timeout=30,
        what="the launch waiting for its host",
        stack=stack,
    )
    assert waiting["state"] == "provisioning"
    assert stack.worker.log().count("tasks.provision[") >= 3  # received, retried, retried
    assert "Retry in" in stack.worker.log()

    # the watchdog marks it unreachable; past HOST_FAILOVER_SECONDS it is lost and its
    # instances fail over: the one that ran, and the launch that waited
    time.sleep(0.6)
    assert [h.name for h in fleet.mark_silent_hosts_unreachable(grace_seconds=0.5)] == ["gpu-1"]
    settings.HOST_FAILOVER_SECONDS = 0
    assert recovery.fail_over_hosts() == 2
    assert Instance.objects.get(pk=second["id"]).state == State.FAILED
    assert not GpuClaim.objects.filter(allocation__instance_id=second["id"]).exists()
    instance = Instance.objects.get(pk=first["id"])
    assert instance.state == State.FAILED
    assert instance.state_reason.startswith("host_lost: host gpu-1 lost at ")
    host.refresh_from_db()
    assert instance.events.order_by("at", "pk").last().at == host.last_heartbeat_at  # billing
    assert not GpuClaim.objects.exists()

    # it comes back (from its state directory, still running the old allocation): reconcile
    # stops what it runs for an instance that failed over, reports it, then removes it as a
    # stop would (its disk stays)
    stack.start_agent("gpu-1", region="local-1", gpus=1, mode="shared")
    wait_for(
        lambda: Host.objects.get(pk=host.pk).status == Host.Status.ACTIVE,
        what="host back",
        stack=stack,
    )
    wait_for(lambda: list(agent_allocations(host)) == held, what="agent restored", stack=stack)
    outcome = tasks.reconcile_host(host.pk)
    assert (outcome["stopped"], outcome["removed"]) == (held, [])
    assert [a["state"] for a in agent_allocations(host).values()] == ["stopped"]
    assert host.events.filter(message__startswith=f"Found allocation {held[0]}").exists()
    assert tasks.reconcile_host(host.pk)["removed"] == held
    assert agent_allocations(host) == {}


def test_a_host_lost_for_good_its_instances_come_back_elsewhere_or_say_why_not(stack, settings):
    """Host gpu-a dies for good: its fresh_disk instance runs again on gpu-b, on a new disk,
    through the real queue and agent; its keep_disk one stays failed, saying why."""
    make_catalog()
    _, membership = make_tenant()
    agent, host_a = start_agent(stack, "gpu-a", gpus=1, mode="shared")
    api = api_client(stack, membership)
    fresh = api.post(
        "/instances/", json={"name": "fresh", "on_host_loss": "fresh_disk", **LAUNCH}
    ).json()
    kept = api.post("/instances/", json={"name": "kept", "restart_policy": "always", **LAUNCH})
    kept = kept.json()
    assert (fresh["restart_policy"], fresh["on_host_loss"]) == ("on-failure", "fresh_disk")
    assert (kept["restart_policy"], kept["on_host_loss"]) == ("always", "keep_disk")
    for instance in (fresh, kept):
        wait_state(api, instance["id"], "running", stack)
    old_disk = Instance.objects.get(pk=fresh["id"]).disk_name
    ran_at = Instance.objects.get(pk=kept["id"]).events.get(to_state=State.RUNNING).at
    wait_for(
        lambda: Host.objects.get(pk=host_a.pk).last_heartbeat_at > ran_at,
        what="a heartbeat while they run",
        stack=stack,
    )
    _, host_b = start_agent(stack, "gpu-b", gpus=1, mode="shared")

    agent.kill()  # for good
    time.sleep(0.6)
    assert [h.name for h in fleet.mark_silent_hosts_unreachable(grace_seconds=0.5)] == ["gpu-a"]
    settings.HOST_FAILOVER_SECONDS = 0
    assert recovery.fail_over_hosts() == 2
    host_a.refresh_from_db()
    lost = f"host gpu-a lost at {host_a.last_heartbeat_at:%Y-%m-%d %H:%M} UTC"

    # the failover queued its provisioning; this process's broker is not the stack's, so the
    # task runs here, against gpu-b's real agent (unless the stack's own periodic tasks, which
    # share the database, got there first on a busy machine: provisioning is idempotent)
    assert Instance.objects.get(pk=fresh["id"]).state in (State.STARTING, State.RUNNING)
    tasks.provision(fresh["id"])
    back = wait_state(api, fresh["id"], "running", stack)
    assert back["disk"]["host"] == "gpu-b"
    instance = Instance.objects.get(pk=fresh["id"])
    assert instance.disk_name != old_disk
    assert list(agent_allocations(host_b)) == [instance.current_allocation().pk]
    steps = [(e.to_state, e.message) for e in instance.events.order_by("at", "pk")][-4:]
    assert steps[:3] == [
        ("unreachable", steps[0][1]),
        (
            "failed",
            f"host_lost: {lost}; it runs again elsewhere on a fresh disk, its old disk stays there",
        ),
        ("starting", "Re-placed on a fresh disk after host gpu-a was lost; GPU slice reserved"),
    ]
    assert steps[3][0] == "running"
    assert host_a.events.filter(message__startswith=f"Disk {old_disk} of instance").exists()

    kept = api.get(f"/instances/{kept['id']}/").json()
    assert (kept["state"], kept["disk"]["host"]) == ("failed", "gpu-a")
    assert kept["state_reason"] == (
        f"host_lost: {lost}; its disk stays there until the host returns (its disk cannot "
        "move; launch with on_host_loss=fresh_disk to come back elsewhere)"
    )


class TestWorkerKilledMidTask:
    @pytest.fixture
    def stack_env(self):
        # a short visibility timeout brings an unacknowledged task back quickly (retries' countdowns
        # stay below it); the agent call waits longer than the test takes to kill the worker
        return {
            "CELERY_VISIBILITY_TIMEOUT": "5",
            "INSTANCE_AGENT_RETRY_BACKOFF_MAX": "2",
            "AGENT_TIMEOUT_SECONDS": "30",
        }

    def test_the_task_is_redelivered_and_the_result_is_right(self, stack):
        make_catalog()
        _, membership = make_tenant()
        agent, host = start_agent(stack, "gpu-1", gpus=1, mode="shared")
        api = api_client(stack, membership)

        os.killpg(agent.pid, signal.SIGSTOP)  # the agent hangs: the worker waits inside PUT
        try:
            created = api.post("/instances/", json={"name": "survivor", **LAUNCH}).json()
            stack.worker.wait_for_log("tasks.provision[")
            received = time.monotonic()
            wait_for(lambda: "PUT http" not in stack.worker.log(), what="in flight")
            time.sleep(0.5)
            stack.worker.kill()  # SIGKILL, the whole process group, mid-call
        finally:
            os.killpg(agent.pid, signal.SIGCONT)
        assert Instance.objects.get(pk=created["id"]).state == State.PROVISIONING

        # the message is unacknowledged (acks_late): once visible again, a new worker runs it
        time.sleep(max(0.0, 5.5 - (time.monotonic() - received)))
        replacement = stack.start_worker("worker2")
        replacement.wait_for_log("ready.")
        running = wait_state(api, created["id"], "running", stack, timeout=30)
        assert running["state_reason"] == ""
        allocation = Instance.objects.get(pk=created["id"]).current_allocation()
        assert list(agent_allocations(host)) == [allocation.pk]  # one allocation, not two
        assert "tasks.provision[" in replacement.log()
        assert [e["to_state"] for e in api.get(f"/instances/{created['id']}/events/").json()[
            "results"]] == ["pending", "provisioning", "running"]  # fmt: skip


def test_a_failing_workload_is_restarted_by_its_policy(stack):
    """A real agent runs a command that exits 1: `on-failure` runs it again after the backoff
    (10 s), `never` leaves it failed."""
    make_catalog()
    _, membership = make_tenant()
    start_agent(stack, "gpu-1", gpus=1, mode="shared", runtime="process")
    api = api_client(stack, membership)
    crash = {**LAUNCH, "command": ["sh", "-c", "sleep 1; exit 1"]}
    again = api.post("/instances/", json={"name": "again", "restart_policy": "on-failure", **crash})
    once = api.post("/instances/", json={"name": "once", "restart_policy": "never", **crash})
    assert (again.status_code, once.status_code) == (202, 202), (again.text, once.text)
    again, once = again.json()["id"], once.json()["id"]
    waiting = wait_for(
        lambda: (body := api.get(f"/instances/{again}/").json())["restarting"] and body,
        what="a restart waiting",
        stack=stack,
    )
    assert (waiting["state"], waiting["exit_code"], waiting["restart_count"]) == ("failed", 1, 1)
    assert waiting["restarting"].endswith("(restart 1, backoff)")
    wait_for(
        lambda: Instance.objects.get(pk=again).events.filter(message__startswith="Restart 1; "),
        what="the restart",
        stack=stack,
        timeout=40,
    )
    wait_for(  # it ran again
        lambda: Instance.objects.get(pk=again).events.filter(to_state=State.RUNNING).count() >= 2,
        what="a second run",
        stack=stack,
    )
    assert api.get(f"/instances/{again}/").json()["restart_count"] >= 1
    never = api.get(f"/instances/{once}/").json()
    assert (never["state"], never["exit_code"], never["restart_count"]) == ("failed", 1, 0)
    assert never["restarting"] is None
