"""Helpers of the tests that run the real stack and real simulated agents."""

import time
from decimal import Decimal

import httpx

from accounts import services as accounts
from accounts.models import Quota
from accounts.roles import Role
from console.catalog.models import Mode
from console.fleet import agent_client
from console.fleet import services as fleet
from console.fleet.models import Host
from tests.factories import (
    GpuModelFactory,
    ImageFactory,
    MembershipFactory,
    RegionFactory,
    SpecFactory,
    TenantFactory,
    UserFactory,
    mig_profile,
)


def wait_for(check, timeout=20.0, what="condition", stack=None, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    logs = stack.logs() if stack is not None else ""
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


def make_catalog():
    region = RegionFactory(code="local-1", name="Local 1")
    a100 = GpuModelFactory()
    ImageFactory()
    common = {"gpu_model": a100, "vcpus": 2, "ram_mib": 8192, "disk_gib": 50}
    SpecFactory(code="a100-quarter", name="A100 1/4", mode=Mode.SHARED, milli=250,
                gpu_memory_mib=20480, price_per_hour=Decimal("0.90"), **common)  # fmt: skip
    SpecFactory(code="a100-half", name="A100 1/2", mode=Mode.SHARED, milli=500,
                gpu_memory_mib=40960, price_per_hour=Decimal("1.80"), **common)  # fmt: skip
    SpecFactory(code="a100-1g10gb", name="A100 MIG 1g.10gb", mode=Mode.MIG, milli=None,
                mig_profile=mig_profile(a100, "1g.10gb"), gpu_memory_mib=9728,
                price_per_hour=Decimal("0.50"), **common)  # fmt: skip
    return region


def make_tenant(slug="acme", username="mia", password="correct-horse-battery", gpu="4"):
    tenant = TenantFactory(slug=slug, name=slug.title())
    Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal(gpu), max_instances=20)
    user = UserFactory(username=username)
    user.set_password(password)
    user.save()
    membership = MembershipFactory(user=user, tenant=tenant, role=Role.MEMBER)
    return tenant, membership


def api_client(stack, membership) -> httpx.Client:
    raw = accounts.issue_token(membership.user, membership.tenant, "e2e").raw
    return httpx.Client(
        base_url=f"{stack.url}/api/v1", headers={"Authorization": f"Bearer {raw}"}, timeout=10
    )


def start_agent(stack, hostname="gpu-1", gpus=2, mode="shared,mig", **runtime):
    """A real simulated agent, registered with a join token, answering our calls
    (`runtime="oci", engine_url=…` for real containers)."""
    _, raw = fleet.create_join_token("local-1")
    proc = stack.start_agent(
        hostname, region="local-1", gpus=gpus, mode=mode, join_token=raw, **runtime
    )
    host = wait_for(
        lambda: Host.objects.filter(name=hostname, status=Host.Status.ACTIVE).first(),
        what=f"{hostname} registered",
        stack=stack,
    )
    wait_for(lambda: host.gpus.count() == gpus, what="its GPUs", stack=stack)
    wait_for(lambda: _answers(host), what=f"{hostname}'s API", stack=stack)
    return proc, Host.objects.get(pk=host.pk)


def _answers(host) -> bool:
    try:
        agent_client.list_allocations(Host.objects.get(pk=host.pk))
        return True
    except agent_client.AgentError:
        return False


def agent_allocations(host) -> dict[str, dict]:
    return {a["id"]: a for a in agent_client.list_allocations(Host.objects.get(pk=host.pk))}


def wait_state(client, instance_id, state, stack=None, timeout=20.0):
    last = {}

    def check():
        last.update(client.get(f"/instances/{instance_id}/").json())
        return last.get("state") == state

    try:
        wait_for(check, timeout=timeout, what=f"instance {instance_id} {state}", stack=stack)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nlast seen: {last}") from None
    return last
