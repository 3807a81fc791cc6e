"""Snapshot storage billed by what each tenant's repository holds: the agent measures it after
every backup, forget and prune (console.snapshots.services.record_measurement), and each
measurement is billed per GiB-second from its second until the next one's, at the region's
snapshot price per GiB-month; a line per size held, the same on the usage page, the budget
figure, the draft and the invoice. Each snapshot shows its unique and shared bytes."""

from datetime import timedelta
from decimal import Decimal
from itertools import pairwise

import pytest
import time_machine
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing import services as billing
from billing.models import Invoice
from billing.usage import so_far, usage_report
from console.snapshots import services
from console.snapshots.models import Snapshot, StoreMeasurement
from tests.billing.conftest import APRIL_1, MARCH, at, snapshot, stored_amount
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db

GIB = 1024**3
DAY = 86400


def taken(world, tenant, source="trainer", store=Snapshot.Store.TENANT) -> Snapshot:
    return Snapshot.objects.create(
        tenant=tenant, region=world.region, source_name=source, disk_name=f"disk-{source}",
        size_gib=600, price_per_gib_month=world.region.snapshot_price_per_gib_month, store=store,
    )  # fmt: skip


def restic_id(n: int) -> str:
    return f"{n:02x}" * 32


def store(total_gib, **shares) -> dict:
    """An agent's measurement: the repository's total, each snapshot's (unique, shared) GiB."""
    return {
        "bytes": int(total_gib * GIB),
        "snapshots": {
            restic_id(int(n[1:])): {
                "bytes": int((u + s) * GIB), "unique": int(u * GIB), "shared": int(s * GIB)
            }
            for n, (u, s) in shares.items()
        },
    }  # fmt: skip


def done(snapshot: Snapshot, when, n: int, added_gib, measured: dict | None) -> None:
    result = {"snapshot": restic_id(n), "bytes_total": 600 * GIB, "bytes_added": added_gib * GIB}
    if measured is not None:
        result["store"] = measured
    with time_machine.travel(when, tick=False):
        services.snapshot_done(snapshot.pk, {"state": "done", "result": result})


def forgotten(snapshot: Snapshot, when, measured: dict) -> None:
    with time_machine.travel(when, tick=False):
        services.delete_snapshot(snapshot)
        services.forgotten(snapshot.pk, {"state": "done", "result": {"store": measured}})


def lines(tenant, now):
    return [
        (line.description, line.seconds, line.amount)
        for line in usage_report(tenant, MARCH, now=now).lines
    ]


def held(gib, seconds) -> tuple:
    return (
        f"Snapshot store: {Decimal(gib):.3f} GiB held at 0.05 per GiB-month",
        seconds,
        stored_amount(gib, "0.05", seconds),
    )


@pytest.fixture
def kept_two(world, tenant):
    """A schedule keeping 2: the first snapshot adds 500 GiB, the next two 1 GiB each, then the
    first is pruned; the two kept still need the 500 GiB (they share it) and 2 GiB more."""
    first, second, third = (taken(world, tenant) for _ in range(3))
    done(first, at(2026, 3, 2), 1, 500, store(500, s1=(500, 0)))
    done(second, at(2026, 3, 3), 2, 1, store(501, s1=(0, 500), s2=(1, 500)))
    done(third, at(2026, 3, 4), 3, 1, store(502, s1=(0, 500), s2=(1, 500), s3=(1, 501)))
    forgotten(first, at(2026, 3, 4, 0, 10), store(502, s2=(1, 500), s3=(1, 501)))
    return first, second, third


def test_two_kept_snapshots_needing_502_gib_are_billed_for_502_gib(tenant, kept_two):
    # by bytes_added the month so far was 2 GiB for 8 days and 500 GiB for 2 days
    now = at(2026, 3, 10)
    assert lines(tenant, now) == [
        held(500, DAY),
        held(501, DAY),
        held(502, 6 * DAY),  # measured after the backup, and again after the prune
    ]
    report = usage_report(tenant, MARCH, now=now)
    [accruing] = report.accruing
    assert (accruing.instance_name, accruing.since) == ("snapshot store", at(2026, 3, 4, 0, 10))
    assert accruing.per_hour == stored_amount(502, "0.05", 3600)
    assert so_far([tenant.pk], MARCH, now)[tenant.pk].amount == report.total
    assert sum(day.amount for day in report.daily) == report.total


def test_each_snapshot_shows_what_deleting_it_frees(kept_two):
    first, second, third = (Snapshot.objects.get(pk=s.pk) for s in kept_two)
    assert (second.bytes_unique, second.bytes_shared) == (GIB, 500 * GIB)
    assert (third.bytes_unique, third.bytes_shared) == (GIB, 501 * GIB)
    # the first's share as last measured (before the prune that removed it): it freed nothing
    assert (first.bytes_unique, first.bytes_shared) == (0, 500 * GIB)
    assert first.forgotten


def test_a_second_tenant_pays_for_its_own_copy_and_keeps_paying(world, tenant, other_tenant):
    mine, theirs = taken(world, tenant), taken(world, other_tenant)
    done(mine, at(2026, 3, 2), 1, 500, store(500, s1=(500, 0)))
    # the same data in another repository: deduplicated within it only, so added in full
    done(theirs, at(2026, 3, 3), 2, 500, store(500, s2=(500, 0)))
    forgotten(mine, at(2026, 3, 5), store(0))
    now = at(2026, 3, 10)
    assert lines(tenant, now) == [held(500, 3 * DAY)]  # nothing after its delete
    assert lines(other_tenant, now) == [held(500, 7 * DAY)]
    assert Snapshot.objects.get(pk=theirs.pk).bytes_unique == 500 * GIB
    assert so_far([tenant.pk], MARCH, now)[tenant.pk].amount == stored_amount(500, "0.05", 3 * DAY)


def test_a_job_that_could_not_measure_keeps_the_last_measurement(world, tenant):
    first, second = taken(world, tenant), taken(world, tenant)
    done(first, at(2026, 3, 2), 1, 10, store(10, s1=(10, 0)))
    done(second, at(2026, 3, 3), 2, 5, None)  # restic could not tell
    assert StoreMeasurement.objects.count() == 1
    assert lines(tenant, at(2026, 3, 4)) == [held(10, 2 * DAY)]
    assert Snapshot.objects.get(pk=second.pk).bytes_unique is None  # shown as not measured


@pytest.mark.parametrize(
    "measured",
    [{"bytes": -1}, {"bytes": "5"}, {"bytes": 5, "snapshots": {"ab": {"unique": 1.5}}}, ["x"]],
)
def test_a_malformed_measurement_is_left_out(world, tenant, measured):
    first, second = taken(world, tenant), taken(world, tenant)
    done(first, at(2026, 3, 2), 1, 10, store(10, s1=(10, 0)))
    done(second, at(2026, 3, 3), 2, 5, measured)
    assert Snapshot.objects.get(pk=second.pk).state == Snapshot.State.DONE
    assert lines(tenant, at(2026, 3, 4)) == [held(10, 2 * DAY)]


def test_two_measurements_in_one_second_the_later_counts(world, tenant):
    first, second = taken(world, tenant), taken(world, tenant)
    done(first, at(2026, 3, 2) + timedelta(milliseconds=200), 1, 10, store(10, s1=(10, 0)))
    done(second, at(2026, 3, 2) + timedelta(milliseconds=700), 2, 5, store(15, s2=(5, 10)))
    assert lines(tenant, at(2026, 3, 3)) == [held(15, DAY)]


def test_a_shared_store_snapshot_stays_billed_for_what_it_added(world, tenant):
    legacy = taken(world, tenant, store=Snapshot.Store.LEGACY)
    done(legacy, at(2026, 3, 2), 1, 3, None)
    Snapshot.objects.filter(pk=legacy.pk).update(bytes_stored=3 * GIB)
    with time_machine.travel(at(2026, 3, 5), tick=False):
        services.delete_snapshot(legacy)
        services.forgotten(legacy.pk, {"state": "done", "result": {"forgotten": []}})
    assert StoreMeasurement.objects.count() == 0  # the shared store is never measured
    [(description, seconds, amount)] = lines(tenant, at(2026, 3, 10))
    assert description == f"Snapshot {legacy.pk} of trainer: 3.000 GiB stored at 0.05 per GiB-month"
    assert (seconds, amount) == (3 * DAY, stored_amount(3, "0.05", 3 * DAY))


def test_the_store_lines_on_the_draft_and_the_invoice(tenant, kept_two):
    billing.run_meter(at(2026, 3, 31))
    assert Invoice.objects.filter(tenant=tenant, month=MARCH).exists()  # the store makes a draft
    billing.finalize_month(MARCH, now=APRIL_1)
    before = snapshot()
    billing.finalize_month(MARCH, now=APRIL_1 + timedelta(hours=1))
    assert snapshot() == before
    invoice = Invoice.objects.get(tenant=tenant, month=MARCH)
    rows = list(invoice.lines.order_by("position").values_list("description", "seconds", "amount"))
    month_end = at(2026, 4, 1) - at(2026, 3, 4)
    assert rows == [held(500, DAY), held(501, DAY), held(502, int(month_end.total_seconds()))]
    assert [line.amount for line in usage_report(tenant, MARCH, now=APRIL_1).lines] == [
        row[2] for row in rows
    ]


MONTH_SECONDS = 31 * DAY
measurements = st.lists(
    st.tuples(
        st.integers(-5 * DAY, 40 * DAY),  # seconds after March 1 (February and April too)
        st.integers(0, 999_999),  # and microseconds
        st.integers(0, 4 * 1024**2),  # MiB held (0: every snapshot deleted)
    ),
    max_size=12,
)


@pytest.mark.slow
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(taken_at=measurements, now_after=st.integers(1, 45 * DAY))
def test_billed_gib_seconds_are_the_integral_of_the_measured_size(world, taken_at, now_after):
    march = at(2026, 3, 1)
    ordered = sorted(taken_at, key=lambda m: m[:2])
    with transaction.atomic():
        tenant = TenantFactory()
        anchor = taken(world, tenant)
        for offset, micros, mib in ordered:
            when = march + timedelta(seconds=offset, microseconds=micros)
            with time_machine.travel(when, tick=False):
                services.record_measurement(anchor, {"store": {"bytes": mib * 1024**2}})
        now = march + timedelta(seconds=now_after)
        report = usage_report(tenant, MARCH, now=now)
        billed = sum(Decimal(line.disk_gib) * GIB * line.seconds for line in report.lines)
        # the measured size, second by second of March until now: each measurement from its
        # second on (the last of a second counts)
        size = {offset: mib * 1024**2 for offset, _, mib in ordered}
        end = int((min(now, at(2026, 4, 1)) - march).total_seconds())
        moments = sorted(size)
        integral = sum(
            size[moment] * max(0, min(after, end) - max(moment, 0))
            for moment, after in pairwise([*moments, end])
        )
        assert billed == integral
        expected = Decimal(integral) / GIB * Decimal("0.05") / MONTH_SECONDS
        assert abs(report.total - expected) <= Decimal("0.000001") * (len(moments) + 1)
        assert so_far([tenant.pk], MARCH, now)[tenant.pk].amount == report.total
        transaction.set_rollback(True)
