"""The real thing: uvicorn + a Celery worker on the test database, a real simulated agent
process, the REST API. Each step checks the agent's own list of allocations."""

from datetime import timedelta

import pytest
from django.utils import timezone

from console.fleet import agent_client
from console.instances import tasks
from console.instances.models import Allocation, Instance, State
from tests.instances.e2e import (
    agent_allocations,
    api_client,
    make_catalog,
    make_tenant,
    start_agent,
    wait_state,
)

pytestmark = [pytest.mark.integration]


def current(instance_id) -> Allocation:
    return Allocation.objects.get(instance_id=instance_id, released_at__isnull=True)


def test_launch_stop_start_resize_terminate(stack):
    make_catalog()
    _, membership = make_tenant()
    _, host = start_agent(stack, "gpu-1", gpus=2, mode="shared,mig")
    api = api_client(stack, membership)

    created = api.post("/instances/", json={"name": "trainer", "spec": "a100-quarter",
                                            "image": "pytorch-2.5-cuda12.4"})  # fmt: skip
    assert created.status_code == 202, created.text
    iid = created.json()["id"]
    wait_state(api, iid, "running", stack)
    first = current(iid)
    on_agent = agent_allocations(host)
    assert list(on_agent) == [first.pk]
    assert on_agent[first.pk]["state"] == "running"
    assert on_agent[first.pk]["shared"] == {"milli": 250, "memory_mib": 20480}

    assert api.post(f"/instances/{iid}/stop/").status_code == 202
    wait_state(api, iid, "stopped", stack)
    assert agent_allocations(host) == {}  # the slice is free on the host too

    assert api.post(f"/instances/{iid}/start/").status_code == 202
    wait_state(api, iid, "running", stack)
    second = current(iid)
    assert second.pk != first.pk
    assert list(agent_allocations(host)) == [second.pk]

    body = {"spec": "a100-half", "allow_restart": True}
    resized = api.post(f"/instances/{iid}/resize/", json=body)
    assert resized.status_code == 202 and resized.json()["state"] == "rebooting"
    done = wait_state(api, iid, "running", stack)
    assert done["spec"] == "a100-half"
    third = current(iid)
    on_agent = agent_allocations(host)
    assert list(on_agent) == [third.pk]  # in place: the old allocation left, the new one runs
    assert on_agent[third.pk]["shared"]["milli"] == 500

    mig = api.post("/instances/", json={"name": "slice", "spec": "a100-1g10gb",
                                        "image": "pytorch-2.5-cuda12.4"}).json()  # fmt: skip
    wait_state(api, mig["id"], "running", stack)
    on_agent = agent_allocations(host)
    assert on_agent[current(mig["id"]).pk]["mig"]["profile"] == "1g.10gb"
    assert on_agent[current(mig["id"]).pk]["gpus"] == [1]

    assert api.post(f"/instances/{iid}/terminate/").status_code == 202
    wait_state(api, iid, "terminated", stack)
    assert list(agent_allocations(host)) == [current(mig["id"]).pk]

    events = api.get(f"/instances/{iid}/events/").json()["results"]
    assert [e["to_state"] for e in events] == [
        "pending", "provisioning", "running", "stopping", "stopped", "starting", "running",
        "rebooting", "running", "terminating", "terminated",
    ]  # fmt: skip

    # reconcile, against the real agent: an orphan is stopped and kept (never destroyed: the
    # console did not make it), a vanished allocation fails its owner
    agent_client.create_allocation(host, "orphan-1", {"mode": "shared", "gpus": [0],
                                   "shared": {"milli": 125, "memory_mib": 1024}})  # fmt: skip
    slice_alloc = current(mig["id"])
    agent_client.delete_allocation(host, slice_alloc.pk)
    Instance.objects.filter(pk=mig["id"]).update(updated_at=timezone.now() - timedelta(seconds=1))
    outcome = tasks.reconcile_host(host.pk)
    assert outcome == {
        "removed": [], "stopped": ["orphan-1"], "adopted": [], "failed": [mig["id"]],
        "redriven": [],
    }  # fmt: skip
    failed = api.get(f"/instances/{mig['id']}/").json()
    assert failed["state"] == "failed"
    assert failed["state_reason"].startswith("allocation_vanished")
    assert {pk: a["state"] for pk, a in agent_allocations(host).items()} == {"orphan-1": "stopped"}
    assert Instance.objects.get(pk=iid).state == State.TERMINATED
