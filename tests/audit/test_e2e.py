"""The audit log through the real processes: uvicorn serving the API (the actor comes from
the request, in the ASGI server's threads), a Celery worker and a simulated agent doing the
work (theirs is the system's, and writes no entry)."""

import pytest

from accounts.roles import Role
from console.audit.models import AuditEntry
from tests.factories import MembershipFactory, UserFactory
from tests.instances.e2e import api_client, make_catalog, make_tenant, start_agent, wait_state

pytestmark = [pytest.mark.integration]


def test_actions_through_the_running_stack(stack):
    make_catalog()
    tenant, membership = make_tenant()
    start_agent(stack, "gpu-1", gpus=1, mode="shared")
    api = api_client(stack, membership)
    token = membership.user.api_tokens.get()

    created = api.post(
        "/instances/",
        json={"name": "trainer", "spec": "a100-quarter", "image": "pytorch-2.5-cuda12.4"},
    )
    assert created.status_code == 202, created.text
    iid = created.json()["id"]
    wait_state(api, iid, "running", stack)
    assert api.post(f"/instances/{iid}/stop/").status_code == 202
    wait_state(api, iid, "stopped", stack)
    assert api.post(f"/instances/{iid}/terminate/").status_code == 202
    wait_state(api, iid, "terminated", stack)

    entries = list(AuditEntry.objects.order_by("pk"))
    # the worker's and the agent's transitions (provisioning → running …), the agent's
    # registration: none is a person's change
    assert [e.action for e in entries] == ["instance.launch", "instance.stop", "instance.terminate"]
    for entry in entries:
        assert (entry.user_id, entry.token_id, entry.tenant_id) == (
            membership.user_id, token.pk, tenant.pk,
        )  # fmt: skip
        assert entry.address == "127.0.0.1" and entry.object_id == str(iid)
    assert (entries[1].before, entries[1].after) == ({"state": "running"}, {"state": "stopping"})

    # a member reads none of it; the tenant's admin reads all of it
    assert api.get("/audit/").status_code == 403
    admin = MembershipFactory(user=UserFactory(username="ada"), tenant=tenant, role=Role.ADMIN)
    reader = api_client(stack, admin)
    listed = reader.get("/audit/", params={"object_type": "instance"}).json()["results"]
    assert [row["action"] for row in listed] == [
        "instance.terminate", "instance.stop", "instance.launch",
    ]  # fmt: skip
    assert listed[0]["actor"] == f"mia (token e2e, gpc_{token.prefix}_…)"
    assert reader.post("/audit/", json={}).status_code == 405
