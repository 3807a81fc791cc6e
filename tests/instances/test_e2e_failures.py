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

    # the agent dies: a launch placed on it is retried, then fails with the reason
    agent.kill()
    second = api.post("/instances/", json={"name": "second", **LAUNCH}).json()
    assert second["state"] == "provisioning"
    failed = wait_state(api, second["id"], "failed", stack, timeout=30)
    assert failed["state_reason"].startswith("agent_unavailable: gave up after 2 retries")
    assert stack.worker.log().count("tasks.provision[") >= 3  # received, retried, retried
    assert "Retry in" in stack.worker.log()
    assert not GpuClaim.objects.filter(allocation__instance_id=second["id"]).exists()

    # the watchdog marks it unreachable; past HOST_FAILOVER_SECONDS its instances fail over
    time.sleep(0.6)
    assert [h.name for h in fleet.mark_silent_hosts_unreachable(grace_seconds=0.5)] == ["gpu-1"]
    settings.HOST_FAILOVER_SECONDS = 0
    assert recovery.fail_over_hosts() == 1
    instance = Instance.objects.get(pk=first["id"])
    assert (instance.state, instance.state_reason) == (State.FAILED, "host_unreachable")
    host.refresh_from_db()
    assert instance.events.order_by("at", "pk").last().at == host.last_heartbeat_at  # billing
    assert not GpuClaim.objects.exists()

    # it comes back (from its state directory, still running the old allocation): reconcile
    # tears down what it runs for instances that are gone
    stack.start_agent("gpu-1", region="local-1", gpus=1, mode="shared")
    wait_for(
        lambda: Host.objects.get(pk=host.pk).status == Host.Status.ACTIVE,
        what="host back",
        stack=stack,
    )
    wait_for(lambda: list(agent_allocations(host)) == held, what="agent restored", stack=stack)
    outcome = tasks.reconcile_host(host.pk)
    assert outcome["removed"] == held
    assert agent_allocations(host) == {}


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
