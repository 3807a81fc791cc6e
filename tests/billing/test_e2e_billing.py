"""A month's invoice end to end, through the real processes (an ASGI server, a Celery worker,
two agents running real containers on Podman, restic): an instance is launched, stopped and
shelved, started again on the other host, resized live, then its host goes silent (its agent
paused) and comes back, the run adopted; it is terminated and the month finalized. The
invoice's total equals a second-by-second replay of the instance's event history, computed
here on its own, to the cent."""

import math
import os
import signal
import time
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal

import pytest
from django.utils import timezone

from agent.devtools.engine import DEMO_IMAGE
from billing.finalize import finalize_grace, finalize_month
from billing.models import Invoice, UsageKind
from billing.rating import next_month_start, seconds_in_month
from console.catalog.models import Mode, Spec
from console.fleet import tasks as fleet_tasks
from console.fleet.models import Host
from console.instances import recovery
from console.instances import tasks as instance_tasks
from console.instances.models import Instance, InstanceEvent, State
from console.snapshots.models import Shelf
from tests.factories import ImageFactory, SpecFactory
from tests.harness import running_stack
from tests.instances.e2e import (
    api_client,
    make_catalog,
    make_tenant,
    start_agent,
    wait_for,
    wait_state,
)

pytestmark = [pytest.mark.integration, pytest.mark.containers, pytest.mark.timeout(500)]

MINIMUM_SECONDS = 60
# A second of its 50 GiB disk costs 0.001 in a 31-day month: its time shelved shows in cents.
DISK_PRICE = Decimal("53.568")
# 4 MiB on its disk, so that its shelve's snapshot holds something
WRITER = (
    "test -f /workspace/data.bin || head -c 4194304 /dev/urandom > /workspace/data.bin; sleep 1000"
)
SILENT_GRACE_SECONDS = 2.0


@pytest.fixture
def stack(transactional_db, redis_url, tmp_path, request, monkeypatch, settings):
    """The real control plane with the disk price above and a snapshot store of this test's,
    in its processes and in this one (which finalizes the month)."""
    store = {
        "SNAPSHOT_REPOSITORY": str(tmp_path / "restic"),
        "SNAPSHOT_PASSWORD": "e2e-restic-password",
        "SNAPSHOT_MASTER_SECRET": "e2e-snapshot-master-secret-of-32-characters-at-least",
        "BILLING_DISK_PRICE_PER_GIB_MONTH": str(DISK_PRICE),
    }
    for name, value in store.items():
        monkeypatch.setenv(name, value)
        setattr(settings, name, Decimal(value) if name.startswith("BILLING") else value)
    with running_stack(redis_url, tmp_path, request.node) as running:
        yield running


@pytest.fixture
def cloud(stack, container_engine):
    """A region of two real container hosts, a spec the quarter resizes to live (fewer vCPUs
    and less RAM, the same GPU slice) and a tenant's API client."""
    make_catalog()
    quarter = Spec.objects.get(code="a100-quarter")
    SpecFactory(
        code="a100-quarter-lite", name="A100 1/4 lite", mode=Mode.SHARED, milli=250,
        gpu_memory_mib=quarter.gpu_memory_mib, gpu_model=quarter.gpu_model, vcpus=1,
        ram_mib=4096, disk_gib=50, price_per_hour=Decimal("0.60"),
    )  # fmt: skip
    ImageFactory(name="demo-busybox", reference=DEMO_IMAGE, command=[], cuda_version="-")
    tenant, membership = make_tenant()
    first, second = (
        start_agent(stack, name, gpus=2, runtime="oci", engine_url=container_engine.url)
        for name in ("gpu-1", "gpu-2")
    )
    return api_client(stack, membership), tenant, first, second


def _set_status(host: Host, status: str) -> None:
    Host.objects.filter(pk=host.pk).update(admin_status=status, status=status)


def _messages(iid: int) -> list[str]:
    return list(InstanceEvent.objects.filter(instance_id=iid).values_list("message", flat=True))


# --- the replay ---------------------------------------------------------------------------


@dataclass
class Replay:
    gpu_seconds: int = 0
    disk_seconds: int = 0
    amount: Decimal = Decimal(0)


def _seconds(start: datetime, end: datetime) -> Decimal:
    delta = end - start
    return Decimal(delta.days * 86400 + delta.seconds) + Decimal(delta.microseconds) / 10**6


def _tenant_start(event: InstanceEvent) -> bool:
    """A launch, or a start a person asked for (the platform's own starts say `system`)."""
    if not event.from_state:
        return True
    return (
        event.from_state in (State.STOPPED, State.FAILED)
        and event.to_state in (State.STARTING, State.PENDING)
        and event.actor_label != "system"
    )


def _disk_after(event: InstanceEvent, had: bool) -> bool:
    """Whether the instance has a disk after `event`: from each placement (where its disk is
    made, or restored after a shelve) until its shelve is done or it is terminated."""
    if event.to_state in (State.TERMINATING, State.TERMINATED):
        return False
    if event.from_state == event.to_state:
        return had and not event.message.startswith("Shelved:")
    return had or event.to_state in (State.PROVISIONING, State.STARTING)


def replay(events: list[InstanceEvent], month_seconds: int) -> Replay:
    """Second by second: each run (from a start its tenant asked for) pays at least the
    minimum once, its running time rounded up once, each second at the price of the spec it
    ran as; its disk, while it does not run and exists, per GiB-second, each such stretch
    rounded up once."""
    result = Replay()
    prices = {spec.pk: spec.current_price() for spec in Spec.objects.all()}
    disk = False
    ran = billed = Decimal(0)  # the current run's running time, and its seconds billed
    stretch = None  # the open disk stretch: [seconds, gib]

    def close_stretch():
        nonlocal stretch
        if stretch is not None:
            seconds = math.ceil(stretch[0])
            result.disk_seconds += seconds
            result.amount += Decimal(stretch[1]) * DISK_PRICE * seconds / month_seconds
            stretch = None

    for event, following in zip(events, events[1:], strict=False):
        if _tenant_start(event):
            ran = billed = Decimal(0)
        disk = _disk_after(event, disk)
        length = _seconds(event.at, following.at)
        if event.to_state == State.RUNNING:
            close_stretch()
            ran += length
            total = max(math.ceil(ran), MINIMUM_SECONDS)
            result.gpu_seconds += total - billed
            result.amount += (total - billed) * prices[event.spec_id] / 3600
            billed = total
        elif disk:
            if stretch is not None and stretch[1] != event.disk_gib:
                close_stretch()
            stretch = stretch or [Decimal(0), event.disk_gib]
            stretch[0] += length
        else:
            close_stretch()
    close_stretch()
    return result


# --- the test -----------------------------------------------------------------------------


def test_the_invoice_of_a_shelved_resized_adopted_instance_equals_its_replay(stack, cloud):
    api, tenant, (_, first), (second_agent, second) = cloud
    _set_status(second, Host.Status.CORDONED)
    body = {"name": "trainer", "spec": "a100-quarter", "image": "demo-busybox",
            "command": ["sh", "-c", WRITER]}  # fmt: skip
    created = api.post("/instances/", json=body)
    assert created.status_code == 202, created.text
    iid = created.json()["id"]
    wait_state(api, iid, "running", stack, timeout=90)

    # stopped and shelved on gpu-1: its disk leaves the host, it stays shelved a while
    assert api.post(f"/instances/{iid}/stop/").status_code == 202
    wait_state(api, iid, "stopped", stack, timeout=60)
    assert api.post(f"/instances/{iid}/shelve/").status_code == 202
    wait_for(
        lambda: Shelf.objects.filter(instance_id=iid, state=Shelf.State.SHELVED).exists(),
        timeout=120, what="shelved", stack=stack,
    )  # fmt: skip
    time.sleep(20)

    # started again by its tenant: placed on gpu-2, where its disk is restored
    _set_status(first, Host.Status.CORDONED)
    _set_status(second, Host.Status.ACTIVE)
    assert api.post(f"/instances/{iid}/start/").status_code == 202
    wait_state(api, iid, "running", stack, timeout=120)
    assert Instance.objects.get(pk=iid).disk_host_id == second.pk

    # resized live once it ran past the minimum, then its host goes silent and comes back
    started = InstanceEvent.objects.filter(instance_id=iid, to_state=State.RUNNING).last().at
    time.sleep(max(0.0, MINIMUM_SECONDS + 1 - (timezone.now() - started).total_seconds()))
    resized = api.post(f"/instances/{iid}/resize/", json={"spec": "a100-quarter-lite"})
    assert resized.status_code == 202, resized.text
    time.sleep(3)  # its new limits reach the agent
    assert Instance.objects.get(pk=iid).spec.code == "a100-quarter-lite"
    os.killpg(second_agent.pid, signal.SIGSTOP)
    try:
        time.sleep(SILENT_GRACE_SECONDS + 1)
        wait_for(
            lambda: "gpu-2" in fleet_tasks.watchdog(SILENT_GRACE_SECONDS)
            or Host.objects.filter(pk=second.pk, status=Host.Status.UNREACHABLE).exists(),
            what="gpu-2 silent", stack=stack,
        )  # fmt: skip
        assert recovery.fail_over_hosts() == 0  # unreachable, not lost
        assert Instance.objects.get(pk=iid).state == State.UNREACHABLE
        time.sleep(2)
    finally:
        os.killpg(second_agent.pid, signal.SIGCONT)
    # heard again; its next reconcile (beat's, every few seconds) finds the run and adopts it
    wait_for(
        lambda: Host.objects.filter(pk=second.pk, status=Host.Status.ACTIVE).exists(),
        what="gpu-2 heard again", stack=stack,
    )  # fmt: skip
    instance_tasks.reconcile_host(second.pk)
    wait_state(api, iid, "running", stack, timeout=30)
    time.sleep(2)
    assert api.post(f"/instances/{iid}/terminate/").status_code == 202
    wait_state(api, iid, "terminated", stack, timeout=60)

    messages = _messages(iid)
    for said in ("Shelved:", "Unshelving: restoring its disk", "live: it kept running",
                 "adopted, not restarted"):  # fmt: skip
        assert any(said in message for message in messages), (said, messages)

    events = list(InstanceEvent.objects.filter(instance_id=iid).order_by("at", "pk"))
    month = events[0].at.date().replace(day=1)
    if events[-1].at >= next_month_start(events[0].at):
        pytest.skip("the history crossed a month boundary")
    finalize_month(month, now=next_month_start(events[0].at) + finalize_grace())
    invoice = Invoice.objects.get(tenant=tenant, month=month, kind=Invoice.Kind.INVOICE)
    assert invoice.status == Invoice.Status.FINALIZED
    lines = list(invoice.lines.all())
    expected = replay(events, seconds_in_month(events[0].at))
    stored = sum((line.amount for line in lines if line.kind == UsageKind.SNAPSHOT), Decimal(0))
    billed = {
        kind: sum(line.seconds for line in lines if line.kind == kind)
        for kind in (UsageKind.GPU, UsageKind.DISK)
    }
    shown = {
        "total": invoice.total,
        "gpu seconds": billed[UsageKind.GPU],
        "disk seconds": billed[UsageKind.DISK],
    }
    replayed = {
        "total": (expected.amount + stored).quantize(Decimal("0.01"), ROUND_HALF_UP),
        "gpu seconds": expected.gpu_seconds,
        "disk seconds": expected.disk_seconds,
    }
    history = "\n".join(f"{e.at:%H:%M:%S.%f} {e} [{e.actor_label}]" for e in events)
    said = f"invoice {shown}, replay {replayed}, snapshot lines {stored}\n{history}"
    assert shown["total"] == replayed["total"], said
    assert shown["gpu seconds"] == replayed["gpu seconds"], said
