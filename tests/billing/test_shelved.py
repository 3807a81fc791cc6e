"""A shelved instance is not billed for its disk (issue 42, item 1): once its shelve is done
(its disk in the shelve's snapshot, on no host), its disk's segment closes; it stays closed
while shelved, a start that waits in `pending` included, and reopens where the disk is made
again, at its placement on unshelve. Repair from the events agrees with the signal path."""

from decimal import Decimal

import pytest
import time_machine
from django.db import connection

from billing import metering, services
from billing.models import Invoice, UsageKind, UsagePiece, UsageSegment
from billing.usage import usage_report
from console.instances.models import State
from console.snapshots import services as snapshots
from console.snapshots.models import Shelf, Snapshot
from tests.billing.conftest import APRIL_1, MARCH, at, move, walk

pytestmark = pytest.mark.django_db

S = State
FIELDS = ("kind", "started_at", "ended_at", "disk_gib")


@pytest.fixture(autouse=True)
def disk_price(settings):
    settings.BILLING_DISK_PRICE_PER_GIB_MONTH = Decimal("0.10")


@pytest.fixture
def queued(monkeypatch):
    """The tasks the snapshot services queue after their commit, recorded instead of sent."""
    sent = []
    monkeypatch.setattr(snapshots, "enqueue_on_commit", lambda name, *args, **_: sent.append(name))
    return sent


@pytest.fixture
def host(world, catalog):
    return catalog.host("gpu-1", region=world.region)


def committed(action, when):
    """Run ``action`` at ``when`` and then its after-commit callbacks (the signals)."""
    with time_machine.travel(when, tick=False):
        start = len(connection.run_on_commit)
        action()
        callbacks = connection.run_on_commit[start:]
        del connection.run_on_commit[start:]
        for _, callback, _robust in callbacks:
            callback()


def shelve(box, requested, done):
    committed(lambda: snapshots.shelve_instance(box), requested)
    snapshot = Snapshot.objects.get(shelf__instance=box)
    result = {"result": {"snapshot": "ef" * 32, "bytes_added": 9}}
    committed(lambda: snapshots.snapshot_done(snapshot.pk, result), done)
    assert Shelf.objects.get(instance=box).state == Shelf.State.SHELVED


def disk_seconds(box) -> int:
    pieces = UsagePiece.objects.filter(instance=box, kind=UsageKind.DISK)
    return sum(pieces.values_list("seconds", flat=True))


def assert_repair_agrees(box) -> None:
    made = list(UsageSegment.objects.filter(instance=box).values_list(*FIELDS))
    UsageSegment.objects.filter(instance=box).delete()
    metering.reconcile_instances([box.pk])
    assert list(UsageSegment.objects.filter(instance=box).values_list(*FIELDS)) == made


def test_a_shelved_instance_bills_its_disk_only_until_its_shelve_is_done(
    world, tenant, host, queued
):
    box = world.running(tenant, at(2026, 3, 1), disk_gib=50, disk_host=host)
    walk(box, [S.STOPPING, S.STOPPED], at(2026, 3, 2, 1))
    shelve(box, at(2026, 3, 2, 1, 30), at(2026, 3, 2, 2))
    assert "console.snapshots.tasks.remove_disk" in queued
    services.run_meter(at(2026, 3, 31, 1))
    # 1 h stopped before the shelve was done (was 2,505,600 s: to the meter's run)
    assert disk_seconds(box) == 3600
    page = usage_report(tenant, MARCH, at(2026, 3, 31, 1))
    [disk] = [line for line in page.lines if line.kind == UsageKind.DISK]
    assert (disk.seconds, disk.amount) == (3600, Decimal("0.006720"))  # 50 GiB × 0.10 / 744
    assert_repair_agrees(box)
    services.run_meter(APRIL_1)
    services.finalize_due(APRIL_1)
    invoice = Invoice.objects.get(tenant=tenant, month=MARCH, kind=Invoice.Kind.INVOICE)
    assert [line.seconds for line in invoice.lines.filter(kind=UsageKind.DISK)] == [3600]


def test_a_shelved_instance_waiting_to_start_bills_no_disk_until_placed(
    world, tenant, host, queued
):
    box = world.running(tenant, at(2026, 3, 1), disk_gib=50, disk_host=host)
    walk(box, [S.STOPPING, S.STOPPED], at(2026, 3, 2, 1))
    shelve(box, at(2026, 3, 2, 1, 30), at(2026, 3, 2, 2))
    move(box, S.PENDING, at(2026, 3, 5))  # started: no room anywhere, it waits
    services.run_meter(at(2026, 3, 6))
    assert disk_seconds(box) == 3600  # nothing while it waits
    move(box, S.PROVISIONING, at(2026, 3, 6))  # placed: its disk is restored there
    move(box, S.RUNNING, at(2026, 3, 6, 0, 10))
    services.run_meter(at(2026, 3, 7))
    # the hour before the shelve, and the 10 min from its placement on unshelve
    assert disk_seconds(box) == 3600 + 600
    assert_repair_agrees(box)


def test_a_failed_unshelve_bills_no_disk_after_it(world, tenant, host, queued, catalog):
    box = world.running(tenant, at(2026, 3, 1), disk_gib=50, disk_host=host)
    walk(box, [S.STOPPING, S.STOPPED], at(2026, 3, 2, 1))
    shelve(box, at(2026, 3, 2, 1, 30), at(2026, 3, 2, 2))
    other = catalog.host("gpu-2", region=world.region)
    move(box, S.STARTING, at(2026, 3, 5))  # started and placed on gpu-2
    committed(lambda: snapshots.hold_for_restore(box.pk, other), at(2026, 3, 5))
    [restore] = box.shelf.restores.all()
    committed(lambda: snapshots.restore_failed(restore.pk, "restic: broken"), at(2026, 3, 5, 0, 5))
    box.refresh_from_db()
    assert box.state == S.FAILED
    services.run_meter(at(2026, 3, 9))
    # the hour before the shelve and the 5 min its restore took; nothing since
    assert disk_seconds(box) == 3600 + 300
    assert_repair_agrees(box)
