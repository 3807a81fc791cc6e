"""Segments from state changes, their repair from the event history, and the meter."""

from decimal import Decimal

import pytest
import time_machine

from billing import bulk, metering, services
from billing.models import Invoice, UsageKind, UsagePiece, UsageSegment
from billing.usage import usage_report
from console.catalog.models import SpecPrice
from console.instances.models import State
from tests.billing.conftest import at, move, snapshot, walk

pytestmark = pytest.mark.django_db

S = State


def gpu_segments(instance):
    return list(
        UsageSegment.objects.filter(instance=instance, kind=UsageKind.GPU).order_by("started_at")
    )


def billed_seconds(instance, kind=UsageKind.GPU) -> int:
    return sum(
        UsagePiece.objects.filter(instance=instance, kind=kind).values_list("seconds", flat=True)
    )


def billed_amount(instance, kind=UsageKind.GPU) -> Decimal:
    return sum(
        (p.amount for p in UsagePiece.objects.filter(instance=instance, kind=kind)), Decimal(0)
    )


def test_running_opens_and_stopping_closes_a_segment(world, tenant):
    box = world.running(tenant, at(2026, 3, 10, 8))
    [segment] = gpu_segments(box)
    assert (segment.started_at, segment.ended_at, segment.source) == (
        at(2026, 3, 10, 8),
        None,
        "signal",
    )
    move(box, S.STOPPING, at(2026, 3, 10, 9, 30, 0, 250_000))
    segment.refresh_from_db()
    assert segment.ended_at == at(2026, 3, 10, 9, 30, 0, 250_000)
    services.run_meter(at(2026, 3, 10, 10))
    # 1 h 30 min 0.25 s rounds up to 5401 s, at 0.90/h
    assert billed_seconds(box) == 5401
    assert billed_amount(box) == Decimal("1.350250")


def test_a_reboot_goes_on_with_the_run(world, tenant):
    box = world.running(tenant, at(2026, 3, 10, 8))
    move(box, S.REBOOTING, at(2026, 3, 10, 8, 0, 10))
    move(box, S.RUNNING, at(2026, 3, 10, 8, 0, 40))
    move(box, S.STOPPING, at(2026, 3, 10, 8, 2, 0))
    services.run_meter(at(2026, 3, 10, 9))
    # 10 s, then 80 s of the same run: 90 s (was 60 s minimum + 80 s)
    assert [s.started_at.second for s in gpu_segments(box)] == [0, 40]
    assert billed_seconds(box) == 90


def test_stopped_disk_is_billed_per_gib_month_pro_rata(world, tenant, settings):
    settings.BILLING_DISK_PRICE_PER_GIB_MONTH = Decimal("0.10")
    box = world.running(tenant, at(2026, 4, 1))
    walk(box, [S.STOPPING, S.STOPPED], at(2026, 4, 1, 1))
    walk(box, [S.STARTING, S.RUNNING], at(2026, 4, 16, 1))  # 15 days stopped of a 30-day month
    services.run_meter(at(2026, 4, 20))
    assert billed_seconds(box, UsageKind.DISK) == 15 * 86400
    # 50 GiB × 0.10 × 15/30
    assert billed_amount(box, UsageKind.DISK) == Decimal("2.500000")
    assert services.stopped_disk_cost_per_month(box) == Decimal("5.000000")


def test_silent_host_stops_costing_at_the_last_heartbeat(world, tenant):
    box = world.running(tenant, at(2026, 3, 10, 8))
    heartbeat = at(2026, 3, 10, 9, 0, 0)
    with time_machine.travel(at(2026, 3, 10, 9, 1, 30), tick=False):
        move(box, S.FAILED, heartbeat)  # noticed 90 s later
    services.run_meter(at(2026, 3, 10, 10))
    assert gpu_segments(box)[0].ended_at == heartbeat
    assert billed_seconds(box) == 3600


def test_receiver_is_idempotent(world, tenant):
    from billing.receivers import on_instance_state_changed

    box = world.running(tenant, at(2026, 3, 10, 8))
    event = move(box, S.STOPPING, at(2026, 3, 10, 9))
    for _ in range(2):  # a redelivered signal
        on_instance_state_changed(box, box, S.RUNNING, S.STOPPING, event.at)
        on_instance_state_changed(box, box, S.PROVISIONING, S.RUNNING, at(2026, 3, 10, 8))
    assert [(s.started_at, s.ended_at) for s in gpu_segments(box)] == [
        (at(2026, 3, 10, 8), at(2026, 3, 10, 9))
    ]


def test_receiver_never_raises(world, tenant, monkeypatch, caplog):
    from billing.receivers import on_instance_state_changed

    def boom(*args):
        raise RuntimeError("database gone")

    monkeypatch.setattr("billing.receivers.record_transition", boom)
    box = world.instance(tenant)
    on_instance_state_changed(box, box, S.PROVISIONING, S.RUNNING, at(2026, 3, 1))
    assert "the meter will repair it" in caplog.text


def test_lost_signals_are_repaired_from_the_events(world, tenant):
    """A crash between the commit of a transition and the receiver loses the signal; the
    meter finds the running periods in the event history."""
    box = world.instance(tenant, when=at(2026, 3, 10, 7))
    walk(box, [S.PROVISIONING, S.RUNNING], at(2026, 3, 10, 8), deliver=False)
    walk(box, [S.STOPPING, S.STOPPED], at(2026, 3, 10, 9), deliver=False)
    move(box, S.STARTING, at(2026, 3, 10, 10), deliver=False)
    move(box, S.RUNNING, at(2026, 3, 10, 10, 5), deliver=False)
    assert not UsageSegment.objects.exists()
    with time_machine.travel(at(2026, 3, 10, 11), tick=False):
        result = services.run_meter()
    assert result.repaired == 3
    segments = [
        (s.kind, s.started_at, s.ended_at, s.source)
        for s in box.usage_segments.order_by("started_at")
    ]
    assert segments == [
        ("gpu", at(2026, 3, 10, 8), at(2026, 3, 10, 9), "repair"),
        ("disk", at(2026, 3, 10, 9), at(2026, 3, 10, 10, 5), "repair"),  # stopped, starting
        ("gpu", at(2026, 3, 10, 10, 5), None, "repair"),
    ]
    # the late signal, delivered after all, changes nothing
    from billing.receivers import on_instance_state_changed

    on_instance_state_changed(box, box, S.STARTING, S.RUNNING, at(2026, 3, 10, 10, 5))
    assert UsageSegment.objects.count() == 3


def test_lost_close_is_repaired_by_the_next_close(world, tenant):
    box = world.running(tenant, at(2026, 3, 10, 8))
    move(box, S.REBOOTING, at(2026, 3, 10, 9), deliver=False)  # close lost
    move(box, S.RUNNING, at(2026, 3, 10, 9, 1))  # opens; finds the earlier one still open
    assert [(s.started_at, s.ended_at) for s in gpu_segments(box)] == [
        (at(2026, 3, 10, 8), at(2026, 3, 10, 9)),
        (at(2026, 3, 10, 9, 1), None),
    ]


def test_segments_split_at_month_and_price_changes_without_changing_the_total(world, tenant):
    box = world.running(tenant, at(2026, 3, 31, 23, 0))
    SpecPrice.objects.create(
        spec=world.quarter, effective_from=at(2026, 4, 1, 0, 30), price_per_hour=Decimal("1.8")
    )
    move(box, S.TERMINATING, at(2026, 4, 1, 1, 0))  # GPU time only: no disk after it
    services.run_meter(at(2026, 4, 2))
    pieces = list(UsagePiece.objects.filter(instance=box).order_by("start"))
    assert [(p.month.month, p.seconds, p.amount) for p in pieces] == [
        (3, 3600, Decimal("0.900000")),
        (4, 1800, Decimal("0.450000")),
        (4, 1800, Decimal("0.900000")),
    ]
    march = usage_report(tenant, at(2026, 3, 1).date(), at(2026, 4, 2))
    april = usage_report(tenant, at(2026, 4, 1).date(), at(2026, 4, 2))
    assert march.total + april.total == Decimal("2.250000")
    assert [line.unit_price_per_hour for line in april.lines] == [Decimal("0.9"), Decimal("1.8")]


def test_meter_twice_changes_nothing_and_open_segments_grow(world, tenant):
    box = world.running(tenant, at(2026, 3, 10, 8))
    services.run_meter(at(2026, 3, 10, 9))
    first = snapshot()
    services.run_meter(at(2026, 3, 10, 9))
    assert snapshot() == first
    assert billed_seconds(box) == 3600
    [piece] = UsagePiece.objects.filter(instance=box)
    assert not piece.is_final
    services.run_meter(at(2026, 3, 10, 10))
    assert billed_seconds(box) == 7200
    assert UsagePiece.objects.filter(instance=box).count() == 1


def test_open_segment_across_months_settles_the_earlier_month(world, tenant):
    box = world.running(tenant, at(2026, 3, 31, 12))
    services.run_meter(at(2026, 4, 1, 12))
    march, april = UsagePiece.objects.filter(instance=box).order_by("start")
    assert (march.seconds, march.is_final) == (12 * 3600, True)
    assert (april.seconds, april.is_final) == (12 * 3600, False)
    assert Invoice.objects.filter(tenant=tenant).count() == 2  # drafts for both months
    segment = gpu_segments(box)[0]
    assert not segment.rated


def test_closed_segment_is_rated_once(world, tenant, django_assert_max_num_queries):
    box = world.running(tenant, at(2026, 3, 10, 8))
    move(box, S.TERMINATING, at(2026, 3, 10, 9))  # no disk segment stays open after it
    services.run_meter(at(2026, 3, 10, 10))
    assert gpu_segments(box)[0].rated
    assert metering.rate_pending(at(2026, 3, 10, 11)) == 0


def test_a_late_close_corrects_pieces_written_while_open(world, tenant):
    box = world.running(tenant, at(2026, 3, 10, 8))
    services.run_meter(at(2026, 3, 10, 10))  # rated as running until 10:00
    with time_machine.travel(at(2026, 3, 10, 10, 1), tick=False):
        move(box, S.FAILED, at(2026, 3, 10, 9))  # the host went silent at 09:00
    services.run_meter(at(2026, 3, 10, 10, 2))
    assert billed_seconds(box) == 3600


@pytest.mark.parametrize("threshold", [1, 10**9])  # COPY (on PostgreSQL) and the ORM
def test_bulk_upsert_paths_agree(world, tenant, monkeypatch, threshold):
    monkeypatch.setattr(bulk, "COPY_THRESHOLD", threshold)
    boxes = [world.running(tenant, at(2026, 3, 31, 22, minute)) for minute in range(3)]
    services.run_meter(at(2026, 4, 1, 1))
    first = {(p.segment_id, p.start): (p.seconds, p.amount_micros, p.is_final)
             for p in UsagePiece.objects.all()}  # fmt: skip
    assert len(first) == 6
    move(boxes[0], S.TERMINATING, at(2026, 3, 31, 23, 30))  # late close: one April piece goes
    services.run_meter(at(2026, 4, 1, 2))
    rows = {(p.segment_id, p.start): (p.seconds, p.amount_micros, p.is_final)
            for p in UsagePiece.objects.all()}  # fmt: skip
    assert len(rows) == 5
    assert billed_seconds(boxes[0]) == 5400 and billed_seconds(boxes[1]) == 4 * 3600 - 60
