"""Volumes on the bill: per GiB-second from creation to deletion whatever the instances do,
at the price per GiB-month of creation, split at month starts; their own lines on the usage
page, the draft, the finalized invoice and the CSV export; every job run twice changes
nothing."""

import csv
import io
from datetime import timedelta
from decimal import Decimal

import pytest

from billing import exports, services
from billing.models import Invoice, UsageKind
from billing.usage import so_far, usage_report
from console.volumes.models import Volume
from tests.billing.conftest import APRIL, APRIL_1, MARCH, at, snapshot, stored_amount

pytestmark = pytest.mark.django_db


def volume(world, tenant, created, *, gib=100, price="0.10", deleted=None, name="data"):
    return Volume.objects.create(
        tenant=tenant, name=name, size_gib=gib, region=world.region,
        price_per_gib_month=Decimal(price), created_at=created, deleted_at=deleted,
    )  # fmt: skip


def test_a_volume_line_to_the_second(world, tenant):
    # created 2026-03-10 08:00:00.4, deleted 2026-03-12 09:30:00: 2 d 1 h 29 min 59.6 s → rounded up
    created = at(2026, 3, 10, 8) + timedelta(milliseconds=400)
    volume(world, tenant, created, deleted=at(2026, 3, 12, 9, 30))
    seconds = 2 * 86400 + 3600 + 30 * 60  # 178200
    [line] = usage_report(tenant, MARCH, now=at(2026, 3, 20)).lines
    assert (line.kind, line.instance_name, line.seconds) == (UsageKind.VOLUME, "data", seconds)
    assert line.amount == stored_amount(100, "0.10", seconds) == Decimal("0.665323")
    assert line.description == "Volume data: 100 GiB at 0.1 per GiB-month"
    assert so_far([tenant.pk], MARCH, at(2026, 3, 20))[tenant.pk].amount == line.amount


def test_a_live_volume_accrues_and_splits_at_the_month(world, tenant):
    volume(world, tenant, at(2026, 3, 31, 12), gib=10, price="0.20")
    march = usage_report(tenant, MARCH, now=at(2026, 4, 2)).lines
    assert [(line.seconds, line.amount) for line in march] == [
        (12 * 3600, stored_amount(10, "0.20", 12 * 3600))
    ]
    report = usage_report(tenant, APRIL, now=at(2026, 4, 2))
    [line] = report.lines
    assert line.seconds == 86400
    assert line.amount == stored_amount(10, "0.20", 86400, 30 * 86400)
    [accruing] = report.accruing
    assert (accruing.kind, accruing.instance_name) == (UsageKind.VOLUME, "data")
    assert accruing.per_hour == stored_amount(10, "0.20", 3600, 30 * 86400)
    assert [row.label for row in report.by_volume] == ["data"] and report.by_instance == []
    assert sum(day.amount for day in report.daily) == report.total


def test_the_volume_line_on_the_draft_the_invoice_and_the_export(world, tenant):
    volume(world, tenant, at(2026, 2, 20), gib=50, deleted=at(2026, 3, 5, 12))
    volume(world, tenant, at(2026, 3, 30), gib=20, name="scratch")
    services.run_meter(at(2026, 3, 31))
    draft = Invoice.objects.get(tenant=tenant, month=MARCH)
    lines = exports.draft_lines(draft, now=at(2026, 3, 31))
    assert [(line.instance_name, line.seconds) for line in lines] == [
        ("data", 4 * 86400 + 12 * 3600),
        ("scratch", 86400),
    ]
    services.finalize_month(MARCH, now=APRIL_1)
    before = snapshot()
    services.finalize_month(MARCH, now=APRIL_1 + timedelta(hours=1))
    assert snapshot() == before
    invoice = Invoice.objects.get(tenant=tenant, month=MARCH)
    stored = list(
        invoice.lines.order_by("position").values_list("kind", "instance_name", "seconds", "amount")
    )
    assert stored == [
        ("volume", "data", 4 * 86400 + 12 * 3600, stored_amount(50, "0.10", 4 * 86400 + 12 * 3600)),
        ("volume", "scratch", 2 * 86400, stored_amount(20, "0.10", 2 * 86400)),
    ]
    assert invoice.subtotal == sum(row[3] for row in stored).quantize(Decimal("0.01"))
    rows = list(csv.DictReader(io.StringIO(exports.month_export_csv(exports.issued(MARCH)))))
    described = [row["description"] for row in rows if row["row_type"] == "line"]
    assert described == [
        "Volume data: 50 GiB at 0.1 per GiB-month",
        "Volume scratch: 20 GiB at 0.1 per GiB-month",
    ]
    issued = usage_report(tenant, MARCH, now=APRIL_1)
    assert [line.amount for line in issued.lines] == [row[3] for row in stored]
    assert sum(day.amount for day in issued.daily) == sum(row[3] for row in stored)


def test_the_meter_twice_changes_nothing(world, tenant):
    volume(world, tenant, at(2026, 3, 2))
    services.run_meter(at(2026, 3, 10))
    before = snapshot()
    services.run_meter(at(2026, 3, 10))
    assert snapshot() == before
    assert Invoice.objects.filter(tenant=tenant, month=MARCH).count() == 1
