"""A launch made while its agent is down (issue 33 item 8), with the real stack and a real
agent: the launch's calls fail through all their retries, but since the console does not hear
the host either, the instance waits on it, saying so, instead of failing; when the agent comes
back the console re-drives the launch at once, and it runs. No failure is ever shown."""

import time

import pytest

from console.fleet import services as fleet
from console.instances import recovery
from console.instances.models import Instance, State
from tests.instances.e2e import api_client, make_catalog, make_tenant, start_agent, wait_for
from tests.instances.e2e import wait_state as wait_api_state

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
OUTAGE_SECONDS = 30


def test_a_launch_across_a_30_s_agent_outage_ends_running_with_no_failure_shown(stack):
    make_catalog()
    _, membership = make_tenant()
    api = api_client(stack, membership)
    agent, host = start_agent(stack, "gpu-1", gpus=2)
    agent.kill()  # down, and not yet missed: the launch is still placed on it
    created = api.post(
        "/instances/",
        json={"name": "waits", "spec": "a100-quarter", "image": "pytorch-2.5-cuda12.4"},
    )
    assert created.status_code == 202, created.text
    iid = created.json()["id"]

    down = time.monotonic()
    waiting = wait_for(
        lambda: (
            (r := api.get(f"/instances/{iid}/").json())["state_reason"].startswith(
                "Waiting for its host gpu-1"
            )
            and r
        ),
        timeout=OUTAGE_SECONDS,
        what="the launch waiting for its host",
        stack=stack,
    )
    assert waiting["state"] == "provisioning"
    while time.monotonic() - down < OUTAGE_SECONDS:  # the beat's watchdog and failover
        fleet.mark_silent_hosts_unreachable()
        recovery.fail_over_hosts()
        time.sleep(1)
    assert Instance.objects.get(pk=iid).state == State.PROVISIONING

    stack.start_agent("gpu-1", region="local-1", gpus=2, mode="shared,mig")
    shown = wait_api_state(api, iid, "running", stack, timeout=60)
    assert shown["state_reason"] == ""
    states = list(Instance.objects.get(pk=iid).events.values_list("to_state", flat=True))
    assert State.FAILED not in states
