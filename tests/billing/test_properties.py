"""Property tests of the billing pipeline: for any walk through the lifecycle with clock
jumps (time_machine), lost signals, silent hosts and price changes, the stored pieces bill
exactly the running time (each run, from a start out of stopped or failed to the next,
rounded up to a second once, the minimum applied once, however a reboot or an adoption
splits it), month and price splits never change the total, and metering or finalizing again
changes nothing."""

from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal

import pytest
import time_machine
from django.db import transaction
from django.test import override_settings
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from billing import services
from billing.finalize import finalize_grace
from billing.models import Invoice, UsageKind, UsagePiece
from billing.rating import month_start, next_month_start, round_to_cents
from billing.usage import usage_report
from console.catalog.models import SpecPrice
from console.instances.lifecycle import TRANSITIONS
from console.instances.models import State
from tests.billing.conftest import LONG_AGO, at, move, snapshot
from tests.factories import TenantFactory

pytestmark = pytest.mark.slow  # property-based: many examples

S = State
DISK_STATES = set(State.values) - {S.RUNNING, S.TERMINATING, S.TERMINATED}
START = at(2026, 1, 27, 22, 13, 5, 123_456)
MICRO = timedelta(microseconds=1)
ZERO = timedelta(0)

gaps = st.one_of(
    st.integers(0, 90_000_000),  # up to 90 s, around the minimum
    st.integers(0, 4 * 3600 * 10**6),  # hours
    st.integers(0, 12 * 86400 * 10**6),  # days: month boundaries
).map(lambda micros: timedelta(microseconds=micros))

steps = st.lists(
    st.tuples(
        st.integers(0, 20),  # which legal next state
        gaps,  # clock jump before it
        st.booleans(),  # the signal is delivered (False: lost in a crash)
        st.floats(0, 1),  # a silent host: how far back its last heartbeat was
    ),
    min_size=1,
    max_size=14,
)

prices = st.lists(
    st.tuples(
        st.integers(1, 40 * 86400),  # seconds after START
        st.integers(1, 99_999).map(lambda cents: Decimal(cents) / 10_000),
    ),
    max_size=3,
    unique_by=lambda change: change[0],
)


def ceil_seconds(length: timedelta) -> int:
    return -(-length // timedelta(seconds=1))


def half_up_6(value: Decimal) -> Decimal:
    return value.quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP)


def oracle_amount(start, end, minimum, history, before=None) -> Decimal:
    """Amount of a segment without month splits: one cumulative curve per price run, the
    segment's part of its run after ``before`` of the run's time (None: its first)."""

    def billed(moment):
        return max(ceil_seconds((before or ZERO) + (moment - start)), minimum)

    points = [(t, p) for t, p in history if start < t < end]
    runs, current = [], [p for t, p in history if t <= start][-1]
    bounds = [start]
    for moment, price in points:
        if price != current:
            runs.append((bounds[-1], moment, current))
            bounds.append(moment)
            current = price
    runs.append((bounds[-1], end, current))
    total, billed_before = Decimal(0), 0 if before is None else billed(start)
    for _run_start, run_end, price in runs:
        seconds = billed(run_end) - billed_before
        billed_before = billed(run_end)
        total += half_up_6(Decimal(seconds) * price / 3600)
    return total


def by_run(spans, now) -> list[tuple]:
    """Each GPU span (start, end or None, run) as (start, end, its run's time before it:
    None for the run's first)."""
    ran: dict[int, timedelta] = {}
    out = []
    for start, end, run in spans:
        out.append((start, end or now, ran.get(run)))
        ran[run] = ran.get(run, ZERO) + (end or now) - start
    return out


@pytest.mark.django_db
@pytest.mark.timeout(600)  # shrinking a failure replays many walks
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    walk=steps,
    changes=prices,
    minimum=st.sampled_from([0, 1, 60, 300]),
    tail=gaps,
    jitter=st.integers(0, 10**6),
)
# Found by this test: every signal lost, and the meter's first run more than an hour (its
# recent-transition window) after a 1 µs run: the run was never billed.
@example(
    walk=[(0, ZERO, False, 0.0), (1, ZERO, False, 0.0), (1, ZERO, False, 0.0)]
    + [(0, MICRO, False, 0.0)],
    changes=[],
    minimum=0,
    tail=timedelta(hours=1) + MICRO,
    jitter=0,
)
# Found by this test: a run's close signal lost, and the next run a microsecond later closed
# by its own signal: that close was taken for the first run's, which was billed a second
# that it never ran (the repair then left a closed segment alone).
@example(
    walk=[(0, ZERO, False, 0.0)] * 3
    + [(1, ZERO, False, 0.0), (1, ZERO, True, 0.0), (0, ZERO, False, 0.0)]
    + [(0, MICRO, False, 0.0), (1, ZERO, False, 0.0), (1, ZERO, False, 0.0)]
    + [(0, ZERO, True, 0.0)],
    changes=[],
    minimum=0,
    tail=ZERO,
    jitter=0,
)
def test_billed_time_matches_running_time(world, walk, changes, minimum, tail, jitter):
    with override_settings(BILLING_MINIMUM_SECONDS=minimum), transaction.atomic():
        _scenario(world, walk, changes, minimum, tail, jitter)
        transaction.set_rollback(True)


def _scenario(world, walk, changes, minimum, tail, jitter):
    tenant = TenantFactory()
    spec = world.whole
    SpecPrice.objects.filter(spec=spec).delete()
    history = [(LONG_AGO, Decimal("3.2"))] + sorted(
        (START + timedelta(seconds=offset), price) for offset, price in changes
    )
    for effective_from, price in history:
        SpecPrice.objects.create(spec=spec, effective_from=effective_from, price_per_hour=price)

    now = START + timedelta(microseconds=jitter)
    box = world.instance(tenant, spec=spec, when=now)
    state, last, placed, run = S.PENDING, now, False, 0
    # the truth: [start, end or None] (GPU: and its run)
    periods = {UsageKind.GPU: [], UsageKind.DISK: []}
    # the disk is billed in every state but running once placed, until terminate; a run
    # that fails as it begins never ran
    billed_state = {UsageKind.GPU: {S.RUNNING}, UsageKind.DISK: DISK_STATES}
    with time_machine.travel(now, tick=False) as clock:
        for choice, gap, deliver, silent in walk:
            targets = sorted(TRANSITIONS[state])
            if not targets:
                break
            target = targets[choice % len(targets)]
            now += gap
            clock.move_to(now)
            when = now
            if target == S.FAILED and silent and state == S.RUNNING:
                when = last + (now - last) * (1 - silent)  # the last heartbeat
            move(box, target, when, deliver=deliver)
            placed = placed or target in (S.PROVISIONING, S.STARTING)  # its disk is made
            if state in (S.STOPPED, S.FAILED) and target in (S.STARTING, S.PENDING):
                run += 1  # a start: a new run (a reboot, an adoption go on with it)
            for kind, billed in billed_state.items():
                spans = periods[kind]
                is_open = bool(spans) and spans[-1][1] is None
                bills_now = target in billed and (placed or kind == UsageKind.GPU)
                if is_open and not bills_now:
                    spans[-1][1] = when
                    if when == spans[-1][0] and (kind == UsageKind.DISK or target == S.FAILED):
                        spans.pop()  # of no length: bills nothing
                elif bills_now and not is_open:
                    spans.append([when, None, run] if kind == UsageKind.GPU else [when, None])
            state, last = target, when
        now += tail
        clock.move_to(now)
        services.run_meter()
        first = snapshot()
        services.run_meter()
        assert snapshot() == first, "metering twice changed something"

        pieces = UsagePiece.objects.filter(instance=box)
        gpu = [p for p in pieces if p.kind == UsageKind.GPU]
        disk = [p for p in pieces if p.kind == UsageKind.DISK]
        runs: dict[int, timedelta] = {}
        for start, end, of in periods["gpu"]:
            runs[of] = runs.get(of, ZERO) + (end or now) - start
        expected_gpu = sum(max(ceil_seconds(length), minimum) for length in runs.values())
        expected_disk = sum(ceil_seconds((end or now) - start) for start, end in periods["disk"])
        assert sum(p.seconds for p in gpu) == expected_gpu
        assert sum(p.seconds for p in disk) == expected_disk
        expected_amount = sum(
            (
                oracle_amount(start, end, minimum, history, before)
                for start, end, before in by_run(periods["gpu"], now)
            ),
            Decimal(0),
        )
        assert sum((p.amount for p in gpu), Decimal(0)) == expected_amount

        # the live report of each month agrees with the stored pieces
        months = sorted({p.month for p in pieces})
        for month in months:
            report = usage_report(tenant, month, now)
            stored = sum((p.amount for p in pieces if p.month == month), Decimal(0))
            assert report.total == stored
            assert sum((day.amount for day in report.daily), Decimal(0)) == stored

        # month end: finalize, twice
        later = next_month_start(now) + finalize_grace() + timedelta(hours=1)
        clock.move_to(later)
        services.run_meter()
        services.finalize_due()
        first = snapshot()
        services.run_meter()
        services.finalize_due()
        assert snapshot() == first, "finalizing twice changed something"
        for invoice in Invoice.objects.filter(tenant=tenant).exclude(status="draft"):
            month_pieces = UsagePiece.objects.filter(tenant=tenant, month=invoice.month)
            assert invoice.subtotal == round_to_cents(
                sum((p.amount for p in month_pieces), Decimal(0))
            )
            assert invoice.month < month_start(later).date()
