"""The producers that already existed send their notices after their commit: an instance
failed (with the reason in words), stopped by the budget, a budget threshold, a host going
into maintenance (one notice per tenant with instances there), an invoice issued."""

from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine

from billing import services as billing
from console.celery import app
from console.fleet import services as fleet
from console.instances.models import Allocation, GpuClaim, State
from console.notifications import services
from console.notifications.models import Notice
from tests.billing.conftest import World, at, move
from tests.factories import TenantFactory
from tests.fleet.conftest import make_inventory

pytestmark = pytest.mark.django_db

S = State


@pytest.fixture
def world(db):
    return World()


def listen(tenant, *kinds):
    """An email endpoint of `tenant` subscribed to `kinds` (no delivery is attempted here)."""
    services.create_endpoint(
        tenant, name=f"ops-{tenant.slug}", channel="email", target="ops@x.test", kinds=list(kinds)
    )


def test_a_failed_instance_says_why_in_words(world, tenant):
    listen(tenant, "instance.failed")
    box = world.running(tenant, at(2026, 3, 2), name="gpu-a")
    move(box, S.FAILED, at(2026, 3, 2, 1))  # runs the after-commit callbacks
    box.refresh_from_db()
    notice = Notice.objects.get(kind="instance.failed")
    assert notice.subject == {"type": "instance", "id": box.pk, "name": "gpu-a"}
    assert notice.text.startswith("gpu-a failed: ")
    assert notice.data["instance_id"] == box.pk and "reason_text" in notice.data


@pytest.fixture
def eager():
    import billing.tasks  # noqa: F401 (registers the tasks that budgets queue by name)
    import console.notifications.tasks  # noqa: F401

    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


def test_budget_threshold_and_budget_stop(
    world, tenant, eager, django_capture_on_commit_callbacks, monkeypatch
):
    from console.instances import queue as instance_queue

    monkeypatch.setattr(instance_queue, "enqueue", lambda *args: None)  # no host calls
    listen(tenant, "budget.threshold", "instance.budget_stopped")
    billing.set_budget(tenant, Decimal("2.00"), "stop")
    box = world.running(tenant, at(2026, 3, 2), spec=world.whole, name="big")
    for minute in (30, 40):
        with (
            time_machine.travel(at(2026, 3, 2, 0, minute), tick=False),
            django_capture_on_commit_callbacks(execute=True),
        ):
            billing.run_meter()
    thresholds = Notice.objects.filter(kind="budget.threshold").order_by("pk")
    assert [n.data["threshold"] for n in thresholds] == [80, 100]
    assert thresholds[1].text == "Spending in March 2026 reached 100% of the monthly budget: " \
        "2.13 USD of 2.00 USD."  # fmt: skip
    stopped = Notice.objects.get(kind="instance.budget_stopped")
    assert stopped.subject["id"] == box.pk
    assert stopped.text.startswith("big: Stopped: monthly budget of 2.00 USD reached at 2.13 USD")


def test_host_maintenance_tells_each_tenant_with_instances_there(
    world, tenant, other_tenant, django_capture_on_commit_callbacks
):
    third = TenantFactory(slug="initech")
    for each in (tenant, other_tenant, third):
        listen(each, "host.maintenance")
    _, raw = fleet.create_join_token(world.region)
    host, _ = fleet.register_host(
        join_token=raw, hostname="host-m", address="http://127.0.0.1:9101",
        remote_addr="127.0.0.1",
        region_code=world.region.code, agent_version="0.1.0",
        inventory=make_inventory("host-m", 2, mode="shared"),
    )  # fmt: skip
    gpu = host.gpus.first()
    for n, owner in enumerate((tenant, tenant, other_tenant)):
        box = world.instance(owner, name=f"on-m-{n}", state=S.RUNNING)
        allocation = Allocation.objects.create(id=f"a{n}", instance=box, host=host, mode=gpu.mode)
        GpuClaim.objects.create(allocation=allocation, gpu=gpu, slot=n, milli=250)
    with django_capture_on_commit_callbacks(execute=True):
        fleet.set_host_status(host, "maintenance", note="new PSU, back at 14:00")
    told = {n.tenant.slug: n for n in Notice.objects.filter(kind="host.maintenance")}
    assert sorted(told) == ["acme", "globex"]
    assert told["acme"].data["instances"] == ["on-m-0", "on-m-1"]
    assert told["acme"].text == (
        "Host host-m is going into maintenance (new PSU, back at 14:00); your instance(s) on "
        "it: on-m-0, on-m-1."
    )
    assert told["globex"].data["instances"] == ["on-m-2"]
    with django_capture_on_commit_callbacks(execute=True):
        fleet.set_host_status(host, "active")
    assert Notice.objects.filter(kind="host.maintenance").count() == 2  # only when it goes in


def test_an_issued_invoice_is_announced(world, tenant, other_tenant):
    listen(tenant, "invoice.issued")
    box = world.running(tenant, at(2026, 3, 3, 8), name="train")
    move(box, S.TERMINATING, at(2026, 3, 3, 8) + timedelta(hours=10))
    billing.run_meter(at(2026, 3, 31))
    from django.db import connection

    start = len(connection.run_on_commit)
    billing.finalize_month(at(2026, 3, 1).date(), now=at(2026, 4, 1, 1))
    for _, callback, _robust in connection.run_on_commit[start:]:
        callback()
    del connection.run_on_commit[start:]
    notice = Notice.objects.get(kind="invoice.issued")
    assert notice.subject["type"] == "invoice" and notice.subject["name"] == "GC-2026-000001"
    assert notice.text == "Invoice GC-2026-000001 for March 2026 was issued: 9.00 USD."
    assert notice.data["total"] == "9.00"
