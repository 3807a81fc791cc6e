"""Finalization, numbers, credits, paid/void with credit notes, documents and exports."""

import csv
import io
import json
import shutil
import subprocess
import zipfile
from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pypdf import PdfReader

from billing import documents, exports, services
from billing.models import CreditApplication, Invoice, InvoiceLine, InvoiceSequence
from billing.money import format_money
from billing.usage import usage_report
from console.instances.models import State
from tests.billing.conftest import at, move, snapshot
from tests.factories import TenantFactory
from tests.pages import SHOTS

pytestmark = pytest.mark.django_db

S = State
MARCH = at(2026, 3, 1).date()
APRIL_1 = at(2026, 4, 1, 2)  # after the grace period


def use(world, tenant, start, hours, *, spec=None, name=None):
    """It runs ``hours``, then is terminated: GPU time only (a stopped one's disk would bill
    on)."""
    box = world.running(tenant, start, spec=spec, name=name)
    move(box, S.TERMINATING, start + timedelta(hours=hours))
    return box


@pytest.fixture
def march(world, tenant):
    """Acme ran a quarter A100 for 10 h and a whole A100 for 2.5 h in March."""
    use(world, tenant, at(2026, 3, 3, 8), 10, name="train")
    use(world, tenant, at(2026, 3, 20, 8), 2.5, spec=world.whole, name="infer")
    services.run_meter(at(2026, 3, 31))
    return tenant


def finalized(tenant, month=MARCH) -> Invoice:
    return Invoice.objects.get(tenant=tenant, kind="invoice", month=month)


def test_draft_while_the_month_runs(march):
    draft = finalized(march)
    assert (draft.status, draft.number) == ("draft", None)
    doc = exports.document(draft, now=at(2026, 3, 31))
    assert doc.number == "DRAFT" and doc.status is documents.InvoiceStatus.DRAFT
    assert doc.subtotal == Decimal("17.00")  # 10 h × 0.90 + 2.5 h × 3.20


def test_finalize_issues_numbered_immutable_invoices(march, world, other_tenant):
    use(world, other_tenant, at(2026, 3, 5), 1)
    result = services.finalize_month(MARCH, now=APRIL_1)
    assert (result.invoices, result.first_number, result.last_number) == (
        2, "GC-2026-000001", "GC-2026-000002",
    )  # fmt: skip
    invoice = finalized(march)
    assert invoice.status == "finalized" and invoice.issued_at == APRIL_1
    assert invoice.number in ("GC-2026-000001", "GC-2026-000002")
    assert (invoice.subtotal, invoice.credits_applied, invoice.tax_amount, invoice.total) == (
        Decimal("17.00"), Decimal("0.00"), Decimal("0.00"), Decimal("17.00"),
    )  # fmt: skip
    assert (invoice.tenant_name, invoice.issuer_name) == ("Acme AI", "gpucloud operator")
    lines = [(x.instance_name, x.spec_code, x.seconds, x.amount) for x in invoice.lines.all()]
    assert lines == [
        ("infer", "a100-1x", 9000, Decimal("8.000000")),
        ("train", "a100-quarter", 36000, Decimal("9.000000")),
    ]
    # the same lines as the usage page of the month
    report = usage_report(march, MARCH, APRIL_1)
    assert [(x.instance_name, x.seconds, x.amount) for x in report.lines] == [
        (name, seconds, amount) for name, _, seconds, amount in lines
    ]
    before = snapshot()
    assert services.finalize_month(MARCH, now=APRIL_1 + timedelta(hours=1)).invoices == 0
    assert snapshot() == before


def test_finalize_refuses_a_month_that_has_not_ended(march):
    with pytest.raises(ValueError, match="not ended"):
        services.finalize_month(MARCH, now=at(2026, 3, 31, 23, 59))


def test_beat_task_waits_for_the_grace_period_and_is_idempotent(march, settings):
    from billing import tasks

    with time_machine.travel(at(2026, 4, 1, 0, 5), tick=False):
        tasks.finalize_invoices()
    assert finalized(march).status == "draft"
    with time_machine.travel(at(2026, 4, 1, 1), tick=False):
        tasks.finalize_invoices()
        first = snapshot()
        tasks.finalize_invoices()
    assert finalized(march).number == "GC-2026-000001"
    assert snapshot() == first


def test_numbers_are_per_year_of_issue_and_gapless(world):
    tenants = [TenantFactory() for _ in range(3)]
    for tenant in tenants:
        use(world, tenant, at(2026, 12, 10), 1)
    services.finalize_month(at(2026, 12, 1).date(), now=at(2027, 1, 1, 3))
    numbers = sorted(Invoice.objects.values_list("number", flat=True))
    assert numbers == ["GC-2027-000001", "GC-2027-000002", "GC-2027-000003"]
    assert InvoiceSequence.objects.get(series="GC", year=2027).last_number == 3


def test_finalize_locks_and_rolls_back_numbers_on_failure(march, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(InvoiceLine.objects, "bulk_create", fail)
    with pytest.raises(RuntimeError):
        services.finalize_month(MARCH, now=APRIL_1)
    assert finalized(march).status == "draft"
    assert not InvoiceSequence.objects.filter(last_number__gt=0).exists()
    monkeypatch.undo()
    services.finalize_month(MARCH, now=APRIL_1)
    assert finalized(march).number == "GC-2026-000001"


def test_credits_never_exceed_the_subtotal_and_carry_over(march, world):
    promo = services.grant_credit(
        march, "5.00", kind="promotional", description="welcome", now=at(2026, 3, 2)
    )
    prepaid = services.grant_credit(march, "20.00", now=at(2026, 3, 2))
    services.finalize_month(MARCH, now=APRIL_1)
    invoice = finalized(march)
    assert (invoice.credits_applied, invoice.total) == (Decimal("17.00"), Decimal("0.00"))
    promo.refresh_from_db()
    prepaid.refresh_from_db()
    assert (promo.remaining, prepaid.remaining) == (Decimal("0.00"), Decimal("8.00"))
    # April: 1 h of the whole A100 = 3.20; the 8.00 left pays it
    use(world, march, at(2026, 4, 2), 1, spec=world.whole)
    services.run_meter(at(2026, 4, 3))
    services.finalize_month(at(2026, 4, 1).date(), now=at(2026, 5, 1, 2))
    april = finalized(march, at(2026, 4, 1).date())
    assert (april.subtotal, april.credits_applied, april.total) == (
        Decimal("3.20"), Decimal("3.20"), Decimal("0.00"),
    )  # fmt: skip
    prepaid.refresh_from_db()
    assert prepaid.remaining == Decimal("4.80")


def test_expired_credit_is_not_used(march):
    with time_machine.travel(at(2026, 2, 1), tick=False):
        services.grant_credit(march, "5.00", expires_at=at(2026, 2, 15))
    services.finalize_month(MARCH, now=APRIL_1)
    assert finalized(march).credits_applied == Decimal("0.00")


def test_grant_credit_validates(tenant):
    from django.core.exceptions import ValidationError

    for amount in ("0", "-1", "1.001", "lots"):
        with pytest.raises(ValidationError):
            services.grant_credit(tenant, amount)


def test_tax_when_configured(march, settings):
    settings.BILLING_TAX_RATE = Decimal("0.19")
    services.grant_credit(march, "2.00", now=at(2026, 3, 2))
    services.finalize_month(MARCH, now=APRIL_1)
    invoice = finalized(march)
    assert (invoice.subtotal, invoice.credits_applied, invoice.tax_rate, invoice.tax_amount) == (
        Decimal("17.00"), Decimal("2.00"), Decimal("0.19"), Decimal("2.85"),
    )  # fmt: skip
    assert invoice.total == Decimal("17.85")


def test_mark_paid(march):
    with pytest.raises(services.InvalidInvoiceState):
        services.mark_paid(finalized(march))  # a draft
    services.finalize_month(MARCH, now=APRIL_1)
    paid = services.mark_paid(finalized(march), now=at(2026, 4, 10))
    assert (paid.status, paid.paid_at) == ("paid", at(2026, 4, 10))
    assert services.mark_paid(paid).paid_at == at(2026, 4, 10)  # again: nothing changes


def test_void_issues_a_credit_note_and_returns_credits(march):
    grant = services.grant_credit(march, "5.00", now=at(2026, 3, 2))
    services.finalize_month(MARCH, now=APRIL_1)
    invoice = finalized(march)
    with pytest.raises(services.InvalidInvoiceState):
        services.void_invoice(Invoice.objects.create(tenant=march, month=at(2026, 5, 1).date()))
    note = services.void_invoice(invoice, reason="wrong spec", now=at(2026, 4, 5))
    invoice.refresh_from_db()
    assert (invoice.status, invoice.void_reason) == ("void", "wrong spec")
    assert invoice.lines.count() == 2  # never edited
    assert (note.kind, note.number, note.corrects_id) == (
        "credit_note",
        "CN-2026-000001",
        invoice.pk,
    )
    assert note.total == -invoice.total == Decimal("-12.00")
    assert [line.amount for line in note.lines.all()] == [
        Decimal("-8.000000"),
        Decimal("-9.000000"),
    ]
    assert note.credits_applied == -invoice.credits_applied == Decimal("-5.00")  # returned
    grant.refresh_from_db()
    assert grant.remaining == Decimal("5.00")
    assert services.void_invoice(invoice).pk == note.pk  # again: the same credit note
    with pytest.raises(services.InvalidInvoiceState):
        services.void_invoice(note)
    pdf = exports.export(note, "pdf").content
    assert "CREDIT NOTE" in PdfReader(io.BytesIO(pdf)).pages[0].extract_text()
    assert not CreditApplication.objects.filter(invoice=note).exists()


@pytest.mark.parametrize("tax", [None, Decimal("0.2")])
def test_exports_parse_back_to_the_same_totals(march, settings, tax):
    settings.BILLING_TAX_RATE = tax or Decimal(0)
    services.grant_credit(march, "1.23", now=at(2026, 3, 2))
    services.finalize_month(MARCH, now=APRIL_1)
    invoice = finalized(march)
    as_csv = exports.export(invoice, "csv")
    assert as_csv.content_type == "text/csv; charset=utf-8"
    assert as_csv.filename == "invoice-GC-2026-000001.csv"
    summary = documents.parse_invoice_csv(as_csv.content.decode())
    assert (summary.subtotal, summary.credits_applied, summary.tax_amount, summary.total) == (
        invoice.subtotal, invoice.credits_applied, invoice.tax_amount, invoice.total,
    )  # fmt: skip
    as_json = documents.parse_invoice_json(exports.export(invoice, "json").content.decode())
    assert as_json == exports.document(invoice)
    assert json.loads(exports.export(invoice, "json").content)["total"] == f"{invoice.total}"
    pdf = PdfReader(io.BytesIO(exports.export(invoice, "pdf").content))
    text = pdf.pages[0].extract_text()
    expected = ["INVOICE", "GC-2026-000001", "Acme AI", "gpucloud operator", "1 Datacenter Way"]
    expected += [format_money(invoice.total, "USD"), "1 Mar 2026 - 31 Mar 2026"]
    for snippet in expected:
        assert snippet in text


def test_draft_exports_render(march):
    draft = finalized(march)
    export = exports.export(draft, "pdf", now=at(2026, 3, 31))
    assert export.filename == "invoice-draft-acme-2026-03.pdf"
    assert "DRAFT" in PdfReader(io.BytesIO(export.content)).pages[0].extract_text()


def test_month_export_csv_and_zip(march, world, other_tenant):
    use(world, other_tenant, at(2026, 3, 5), 1)
    services.finalize_month(MARCH, now=APRIL_1)
    services.void_invoice(finalized(other_tenant))
    issued = exports.issued(MARCH)
    rows = list(csv.DictReader(io.StringIO(exports.month_export_csv(issued))))
    lines: dict[str, Decimal] = {}
    for row in rows:
        if row["row_type"] == "line":
            lines[row["invoice_number"]] = lines.get(row["invoice_number"], 0) + Decimal(
                row["amount"]
            )
    for invoice in issued:
        assert lines[invoice.number] == sum(line.amount for line in invoice.lines.all())
    assert {row["status"] for row in rows} == {"finalized", "void"}
    [note] = [
        row for row in rows if row["document"] == "credit_note" and row["row_type"] == "total"
    ]
    assert note["corrects"] == finalized(other_tenant).number
    # the net: what the tenants owe for March, the void invoice cancelled by its note
    net = sum(Decimal(row["amount"]) for row in rows if row["row_type"] == "total")
    assert net == finalized(march).total
    archive = zipfile.ZipFile(io.BytesIO(exports.pdf_zip(issued)))
    assert sorted(archive.namelist()) == sorted(
        [
            "invoice-GC-2026-000001.pdf",
            "invoice-GC-2026-000002.pdf",
            "credit-note-CN-2026-000001.pdf",
        ]
    )
    assert all(archive.read(name).startswith(b"%PDF") for name in archive.namelist())


def test_issued_month_is_frozen(march, world, tenant):
    """Usage that reaches a month after its invoice was issued changes nothing on it."""
    box = world.instance(tenant, when=at(2026, 3, 30))
    services.finalize_month(MARCH, now=APRIL_1)
    before = finalized(march).total
    with time_machine.travel(at(2026, 4, 1, 3), tick=False):
        from tests.billing.conftest import walk

        walk(box, [S.PROVISIONING, S.RUNNING], at(2026, 3, 31, 20))  # news from March, late
        services.run_meter()
    invoice = finalized(march)
    assert invoice.total == before and invoice.lines.count() == 2


def test_finalization_query_count_does_not_grow_with_tenants(world):
    counts = []
    for month, size in ((at(2026, 5, 1), 3), (at(2026, 6, 1), 12)):
        for _ in range(size):
            tenant = TenantFactory()
            use(world, tenant, month + timedelta(days=2), 1)
            use(world, tenant, month + timedelta(days=3), 2, spec=world.whole)
            services.grant_credit(tenant, "1.00", now=month)
        services.run_meter(month + timedelta(days=10))
        end = month.replace(month=month.month + 1) + timedelta(hours=2)
        with CaptureQueriesContext(connection) as queries:
            assert services.finalize_month(month.date(), now=end).invoices == size
        counts.append(len(queries))
    if connection.vendor == "postgresql":
        assert counts[0] == counts[1]
    else:  # SQLite caps parameters per statement: only the bulk writes are batched
        assert counts[1] - counts[0] <= 4


@pytest.mark.integration
@pytest.mark.skipif(not shutil.which("pdftoppm"), reason="poppler-utils (pdftoppm) is missing")
def test_pdf_renders_to_an_image(march, settings, tmp_path):
    """The PDF rasterizes (pdftoppm); the PNG is kept in var/screenshots to look at."""
    settings.BILLING_TAX_RATE = Decimal("0.19")
    services.grant_credit(march, "5.00", now=at(2026, 3, 2))
    services.finalize_month(MARCH, now=APRIL_1)
    pdf = tmp_path / "invoice.pdf"
    pdf.write_bytes(exports.export(finalized(march), "pdf").content)
    subprocess.run(["pdftoppm", "-png", "-r", "60", "-singlefile", pdf, tmp_path / "invoice"],
                   check=True, timeout=60)  # fmt: skip
    png = (tmp_path / "invoice.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    SHOTS.mkdir(parents=True, exist_ok=True)
    (SHOTS / "billing-invoice-pdf.png").write_bytes(png)
