"""Snapshot storage on the bill, for snapshots of the shared store of before the split per tenant
(their tenants' repositories are test_snapshot_store_billing.py's): the data each snapshot added
to the store, per GiB-second from the moment it is done until it is deleted, at its region's
price per GiB-month when it was taken, split at month starts; a line of its own on the usage
page, the draft, the finalized invoice, its exports, the month's CSV and the budget; every job
run twice changes nothing."""

import csv
import io
import json
from datetime import timedelta
from decimal import Decimal

import pytest

from billing import exports, services
from billing.models import Invoice, UsageKind
from billing.usage import so_far, usage_report
from console.snapshots.models import Snapshot
from tests.billing.conftest import APRIL, APRIL_1, MARCH, at, snapshot, stored_amount

pytestmark = pytest.mark.django_db

GIB = 1024**3


def stored(world, tenant, finished, *, bytes_stored=2 * GIB, price="0.05", deleted=None,
           source="trainer", state=Snapshot.State.DONE):  # fmt: skip
    return Snapshot.objects.create(
        tenant=tenant, region=world.region, source_name=source, disk_name=f"disk-{source}",
        size_gib=10, state=state, created_at=finished - timedelta(minutes=5),
        finished_at=finished, deleted_at=deleted, bytes_stored=bytes_stored,
        price_per_gib_month=Decimal(price), restic_id="ab" * 32, store=Snapshot.Store.LEGACY,
    )  # fmt: skip


def test_a_snapshot_line_to_the_second(world, tenant):
    # done 2026-03-10 08:00:00.4, deleted 2026-03-12 09:30:00: 2 d 1 h 29 min 59.6 s → rounded up
    done = at(2026, 3, 10, 8) + timedelta(milliseconds=400)
    kept = stored(world, tenant, done, bytes_stored=3 * GIB // 2, deleted=at(2026, 3, 12, 9, 30))
    seconds = 2 * 86400 + 3600 + 30 * 60  # 178200
    [line] = usage_report(tenant, MARCH, now=at(2026, 3, 20)).lines
    assert (line.kind, line.instance_name, line.seconds) == (UsageKind.SNAPSHOT, "trainer", seconds)
    assert (line.snapshot_id, line.instance_id, line.volume_id) == (kept.pk, 0, 0)
    assert line.amount == stored_amount("1.5", "0.05", seconds) == Decimal("0.004990")
    assert line.description == (
        f"Snapshot {kept.pk} of trainer: 1.500 GiB stored at 0.05 per GiB-month"
    )
    assert so_far([tenant.pk], MARCH, at(2026, 3, 20))[tenant.pk].amount == line.amount


def test_what_is_not_billed(world, tenant):
    stored(world, tenant, at(2026, 3, 2), bytes_stored=0)  # added nothing to the store
    stored(world, tenant, at(2026, 3, 2), state=Snapshot.State.FAILED)
    stored(world, tenant, at(2026, 3, 25))  # done after now
    stored(world, tenant, at(2026, 2, 2), deleted=at(2026, 2, 20))  # gone before the month
    assert usage_report(tenant, MARCH, now=at(2026, 3, 20)).lines == []
    assert so_far([tenant.pk], MARCH, at(2026, 3, 20))[tenant.pk].amount == 0


def test_a_kept_snapshot_accrues_and_splits_at_the_month(world, tenant):
    kept = stored(world, tenant, at(2026, 3, 31, 12), bytes_stored=10 * GIB, price="0.20")
    march = usage_report(tenant, MARCH, now=at(2026, 4, 2)).lines
    assert [(line.seconds, line.amount) for line in march] == [
        (12 * 3600, stored_amount(10, "0.20", 12 * 3600))
    ]
    report = usage_report(tenant, APRIL, now=at(2026, 4, 2))
    [line] = report.lines
    assert line.seconds == 86400
    assert line.amount == stored_amount(10, "0.20", 86400, 30 * 86400)
    [accruing] = report.accruing
    assert (accruing.kind, accruing.instance_name, accruing.since) == (
        UsageKind.SNAPSHOT, "trainer", kept.finished_at,
    )  # fmt: skip
    assert accruing.per_hour == stored_amount(10, "0.20", 3600, 30 * 86400)
    assert [row.label for row in report.by_snapshot] == [f"{kept.pk} of trainer"]
    assert report.by_instance == [] and report.by_volume == []
    assert sum(day.amount for day in report.daily) == report.total


def test_the_snapshot_line_on_the_draft_the_invoice_and_the_exports(world, tenant):
    old = stored(world, tenant, at(2026, 2, 20), bytes_stored=GIB, deleted=at(2026, 3, 5, 12))
    new = stored(world, tenant, at(2026, 3, 30), bytes_stored=GIB // 4, source="data")
    services.run_meter(at(2026, 3, 31))
    draft = Invoice.objects.get(tenant=tenant, month=MARCH)  # snapshots alone make a draft
    lines = exports.draft_lines(draft, now=at(2026, 3, 31))
    assert [(line.snapshot_id, line.seconds) for line in lines] == [
        (new.pk, 86400),
        (old.pk, 4 * 86400 + 12 * 3600),
    ]
    draft_json = json.loads(exports.export(draft, "json", now=at(2026, 3, 31)).content)
    assert [line["description"] for line in draft_json["lines"]] == [
        line.description for line in lines
    ]
    assert exports.export(draft, "pdf", now=at(2026, 3, 31)).content.startswith(b"%PDF")
    services.finalize_month(MARCH, now=APRIL_1)
    before = snapshot()
    services.finalize_month(MARCH, now=APRIL_1 + timedelta(hours=1))
    assert snapshot() == before
    invoice = Invoice.objects.get(tenant=tenant, month=MARCH)
    rows = list(
        invoice.lines.order_by("position").values_list("kind", "instance_name", "seconds", "amount")
    )
    kept = 4 * 86400 + 12 * 3600  # trainer's, from March 1 until its delete
    assert rows == [
        ("snapshot", "data", 2 * 86400, stored_amount("0.25", "0.05", 2 * 86400)),
        ("snapshot", "trainer", kept, stored_amount(1, "0.05", kept)),
    ]
    assert invoice.subtotal == sum(row[3] for row in rows).quantize(Decimal("0.01"))
    month_csv = csv.DictReader(io.StringIO(exports.month_export_csv(exports.issued(MARCH))))
    assert [row["description"] for row in month_csv if row["row_type"] == "line"] == [
        f"Snapshot {new.pk} of data: 0.250 GiB stored at 0.05 per GiB-month",
        f"Snapshot {old.pk} of trainer: 1.000 GiB stored at 0.05 per GiB-month",
    ]
    issued = usage_report(tenant, MARCH, now=APRIL_1)
    assert [line.amount for line in issued.lines] == [row[3] for row in rows]
    assert sum(day.amount for day in issued.daily) == sum(row[3] for row in rows)


def test_the_meter_twice_changes_nothing(world, tenant):
    stored(world, tenant, at(2026, 3, 2))
    services.run_meter(at(2026, 3, 10))
    before = snapshot()
    services.run_meter(at(2026, 3, 10))
    assert snapshot() == before
    assert Invoice.objects.filter(tenant=tenant, month=MARCH).count() == 1
