"""One minimum and one rounding per run (issue 42, item 4): the segments of one run (split by
a live resize, a restart of the platform, a reboot, an adoption after a silent host) are
billed as one length, rounded up once, at least the minimum once; only a start the tenant
asks for (launch, start) begins a new run. Every figure agrees (usage page, draft, issued
invoice) and repair from the events gives the same segments."""

import pytest
import time_machine
from django.db import connection, transaction

from billing import metering, services
from billing.models import Invoice, UsageKind, UsagePiece, UsageSegment
from billing.rating import round_to_cents
from billing.usage import usage_report
from console.instances import lifecycle
from console.instances.models import Instance, State
from tests.billing.conftest import APRIL_1, MARCH, at, move, walk

pytestmark = pytest.mark.django_db

S = State
RUN_FIELDS = ("kind", "spec_id", "started_at", "ended_at", "run_started_at", "run_before")


def live_resize(box: Instance, spec, when) -> None:
    """As resize_instance does for a change its host takes live: the new spec, a note, and
    after commit the signal from running to running."""
    with time_machine.travel(when, tick=False):
        start = len(connection.run_on_commit)
        with transaction.atomic():
            Instance.objects.filter(pk=box.pk).update(spec=spec)
            box.spec = spec
            lifecycle.record_live_change(box, f"Resized to {spec.code}")
        callbacks = connection.run_on_commit[start:]
        del connection.run_on_commit[start:]
        for _, callback, _robust in callbacks:
            callback()


def gpu_seconds(box) -> int:
    return sum(
        UsagePiece.objects.filter(instance=box, kind=UsageKind.GPU).values_list(
            "seconds", flat=True
        )
    )


def segments(box) -> list[tuple]:
    return list(
        UsageSegment.objects.filter(instance=box)
        .order_by("kind", "started_at")
        .values_list(*RUN_FIELDS)
    )


def assert_every_figure(box, tenant, seconds: int) -> None:
    """The meter's pieces, the usage page, the draft and, once March is issued, the
    invoice all bill the run ``seconds`` of GPU time; and repair from the events alone
    makes the same segments."""
    services.run_meter(at(2026, 3, 20))
    assert gpu_seconds(box) == seconds
    page = usage_report(tenant, MARCH, at(2026, 3, 20))
    assert sum(line.seconds for line in page.lines if line.kind == UsageKind.GPU) == seconds
    made = segments(box)
    UsageSegment.objects.filter(instance=box).delete()
    metering.reconcile_instances([box.pk])
    assert segments(box) == made
    services.run_meter(APRIL_1)
    services.finalize_due(APRIL_1)
    invoice = Invoice.objects.get(tenant=tenant, month=MARCH, kind=Invoice.Kind.INVOICE)
    assert invoice.status == Invoice.Status.FINALIZED
    lines = invoice.lines.filter(kind=UsageKind.GPU)
    assert sum(line.seconds for line in lines) == seconds
    page = usage_report(tenant, MARCH, APRIL_1)
    assert invoice.subtotal == round_to_cents(page.total)


def test_a_live_resize_5_s_before_the_stop_bills_the_run_once(world, tenant):
    box = world.running(tenant, at(2026, 3, 10, 8))
    live_resize(box, world.whole, at(2026, 3, 10, 9))
    move(box, S.STOPPING, at(2026, 3, 10, 9, 0, 5))
    # 3,605 s ran: 3,600 s at the old spec, 5 s at the new (was 3,600 + a 60 s minimum)
    assert_every_figure(box, tenant, 3605)
    pieces = UsagePiece.objects.filter(instance=box, kind=UsageKind.GPU).order_by("start")
    assert [(p.spec_id, p.seconds) for p in pieces] == [
        (world.quarter.pk, 3600),
        (world.whole.pk, 5),
    ]


def test_a_live_resize_at_a_fraction_of_a_second_rounds_up_once(world, tenant):
    box = world.running(tenant, at(2026, 3, 10, 8))
    live_resize(box, world.whole, at(2026, 3, 10, 8, 5, 0, 400_000))
    move(box, S.STOPPING, at(2026, 3, 10, 8, 10))
    # 600 s ran: 300.4 s billed 301, the rest 299 (was 301 + 300 = 601)
    assert_every_figure(box, tenant, 600)


def test_a_run_adopted_back_after_a_silent_host_is_one_run(world, tenant):
    box = world.running(tenant, at(2026, 3, 10, 8))
    silent = at(2026, 3, 10, 8, 30, 0, 500_000)
    move(box, S.UNREACHABLE, silent)
    move(box, S.RUNNING, silent)  # adopted: billed on from where it went silent
    move(box, S.STOPPING, at(2026, 3, 10, 8, 30, 10))
    # 1,810 s ran (was 1,801 + a 60 s minimum = 1,861)
    assert_every_figure(box, tenant, 1810)


def test_a_restarting_resize_after_13_s_bills_one_minimum(world, tenant):
    box = world.running(tenant, at(2026, 3, 10, 8))
    Instance.objects.filter(pk=box.pk).update(spec=world.whole)
    box.spec = world.whole
    move(box, S.REBOOTING, at(2026, 3, 10, 8, 0, 13))  # restarting on its GPU
    move(box, S.RUNNING, at(2026, 3, 10, 8, 0, 30))
    move(box, S.STOPPING, at(2026, 3, 10, 8, 0, 50))
    # 13 s + 20 s of one run: the 60 s minimum once (was 60 + 60)
    assert_every_figure(box, tenant, 60)


def test_a_restart_of_the_platform_goes_on_with_the_run(world, tenant):
    box = world.running(tenant, at(2026, 3, 10, 8))
    walk(box, [S.STOPPING, S.STOPPED], at(2026, 3, 10, 8, 0, 20))  # its workload exited
    with transaction.atomic():  # the restart policy's start
        lifecycle.transition(box, S.STARTING, at=at(2026, 3, 10, 8, 1), continues_run=True)
    move(box, S.RUNNING, at(2026, 3, 10, 8, 1))
    move(box, S.STOPPING, at(2026, 3, 10, 8, 1, 30))
    # 20 s + 30 s of one run: 60 s (was 60 + 60)
    assert_every_figure(box, tenant, 60)


def test_a_start_the_tenant_asks_for_begins_a_new_minimum(world, tenant):
    box = world.running(tenant, at(2026, 3, 10, 8))
    live_resize(box, world.whole, at(2026, 3, 10, 8, 0, 10))
    walk(box, [S.STOPPING, S.STOPPED], at(2026, 3, 10, 8, 0, 20))
    walk(box, [S.STARTING, S.RUNNING], at(2026, 3, 10, 9))  # the tenant's start
    move(box, S.STOPPING, at(2026, 3, 10, 9, 0, 30))
    # 20 s (one minimum), then 30 s (a new one)
    assert_every_figure(box, tenant, 60 + 60)


def test_a_run_split_across_a_month_and_a_resize_rounds_once(world, tenant):
    box = world.running(tenant, at(2026, 2, 28, 23, 59, 59, 500_000))
    live_resize(box, world.whole, at(2026, 3, 1, 0, 0, 10, 200_000))
    move(box, S.STOPPING, at(2026, 3, 1, 0, 1, 30))
    services.run_meter(at(2026, 3, 20))
    pieces = UsagePiece.objects.filter(instance=box, kind=UsageKind.GPU).order_by("start")
    # 90.5 s in all, billed 91 once: February's 0.5 s carries the 60 s minimum
    assert [(p.month.month, p.seconds) for p in pieces] == [(2, 60), (3, 0), (3, 31)]
    assert sum(p.seconds for p in pieces) == 91
