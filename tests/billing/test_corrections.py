"""A correction that arrives after issue (issues 27 and 42): the issued invoice stands. One
that takes money back is a credit note against the month it corrects (its own ``CN``
number, PDF, CSV and JSON), issued when the month it was found in is finalized, once; it is
never a negative line on the open month's invoice. One that adds (a repair found more usage)
is a line on the open month's invoice naming the invoice it corrects. A month of 0.00 is
issued without a number: nothing to pay."""

import io
from decimal import Decimal

import pytest
from django.test import override_settings
from pypdf import PdfReader

from billing import budgets, services
from billing.corrections import InvalidInvoiceState
from billing.documents import parse_invoice_csv, parse_invoice_json
from billing.exports import export, with_so_far
from billing.metering import end_at_last_heartbeat
from billing.models import Invoice, InvoiceSequence, UsageCorrection
from billing.usage import usage_report
from console.instances.models import State
from tests.billing.conftest import APRIL, MARCH, at, move, walk

S = State


@pytest.fixture(autouse=True)
def no_disk_price(settings):
    settings.BILLING_DISK_PRICE_PER_GIB_MONTH = Decimal("0")


def pdf_text(content: bytes) -> str:
    return "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(content)).pages)


def documents_now() -> dict:
    return {
        doc.pk: (doc.number, doc.status, doc.total, list(doc.lines.values_list("amount")))
        for doc in Invoice.objects.exclude(status=Invoice.Status.DRAFT)
    }


def test_a_late_failover_that_takes_hours_back_is_a_credit_note_against_its_month(
    world, tenant, member, web, token_client
):
    # March: 51,400 s at 0.90 per hour = 12.85, issued at 00:15 on April 1.
    box = world.running(tenant, at(2026, 3, 31, 9, 43, 20))
    services.run_meter(at(2026, 4, 1, 0, 20))
    services.finalize_due(at(2026, 4, 1, 0, 20))
    march = Invoice.objects.get(tenant=tenant, kind="invoice", month=MARCH)
    assert (march.number, march.total) == ("GC-2026-000001", Decimal("12.85"))
    # At 00:30 the failover finds its host silent since 13:00 on March 31: 11 h less.
    move(box, S.STOPPING, at(2026, 4, 1, 0, 30))
    end_at_last_heartbeat(box, at(2026, 3, 31, 13))
    move(box, S.STOPPED, at(2026, 4, 1, 0, 30))
    other = world.running(tenant, at(2026, 4, 10, 10))
    walk(other, [S.STOPPING, S.STOPPED], at(2026, 4, 10, 14, 36, 40))  # 16,600 s: 4.15
    now = at(2026, 4, 20)
    services.run_meter(now)
    services.run_meter(now)
    (fix,) = UsageCorrection.objects.all()
    assert (fix.seconds, fix.amount_micros) == (-11 * 3600, -9_900_000)
    # April's figures are April's usage: the 9.90 is March's, on its credit note.
    assert usage_report(tenant, APRIL, now).total == Decimal("4.150000")
    assert budgets.month_to_date(tenant, now) == Decimal("4.150000")
    assert budgets.spent_this_month([tenant.pk], now) == {tenant.pk: Decimal("4.150000")}
    draft = Invoice.objects.get(tenant=tenant, kind="invoice", month=APRIL)
    assert with_so_far([draft], now)[0].so_far_totals.total == Decimal("4.15")

    services.finalize_due(at(2026, 5, 1, 1))
    before = documents_now()
    services.finalize_due(at(2026, 5, 1, 2))  # run twice: nothing changes
    assert documents_now() == before
    april = Invoice.objects.get(tenant=tenant, kind="invoice", month=APRIL)
    assert (april.number, april.total) == ("GC-2026-000002", Decimal("4.15"))
    assert not april.lines.filter(amount__lt=0).exists()
    (note,) = Invoice.objects.filter(kind="credit_note")
    assert (note.number, note.month, note.corrects, note.credits) == (
        "CN-2026-000001",
        MARCH,
        march,
        "correction",
    )
    assert (note.subtotal, note.tax_amount, note.total) == (
        Decimal("-9.90"),
        Decimal("0.00"),
        Decimal("-9.90"),
    )
    (line,) = note.lines.all()
    assert (line.seconds, line.amount) == (-11 * 3600, Decimal("-9.900000"))
    assert march.number in line.description and box.name in line.description
    fix.refresh_from_db()
    assert fix.credit_note == note
    march.refresh_from_db()
    assert march.total == Decimal("12.85")  # the issued invoice stands
    sequences = dict(InvoiceSequence.objects.values_list("series", "last_number"))
    assert sequences == {"GC": 2, "CN": 1}  # no gaps

    csv = parse_invoice_csv(export(note, "csv").content.decode())
    assert (csv.number, csv.subtotal, csv.total) == (
        "CN-2026-000001",
        Decimal("-9.90"),
        Decimal("-9.90"),
    )
    doc = parse_invoice_json(export(note, "json").content.decode())
    assert (doc.document, doc.corrects, doc.total) == (
        "credit_note",
        march.number,
        Decimal("-9.90"),
    )
    text = pdf_text(export(note, "pdf").content)
    assert "CREDIT NOTE" in text.upper() and "CN-2026-000001" in text and "-9.90" in text

    api = token_client(member)
    listed = api.get("/api/v1/invoices/").json()["results"]
    by_number = {row["number"]: row for row in listed}
    assert by_number["GC-2026-000001"]["credit_notes"] == [note.pk]
    assert by_number["CN-2026-000001"]["corrects"] == march.pk
    page = web.get("/billing/invoices/").content.decode()
    assert "CN-2026-000001" in page and "credit note for GC-2026-000001" in page
    page = web.get(f"/billing/invoices/{march.pk}/").content.decode()
    assert "Corrected by credit note" in page and "CN-2026-000001" in page
    # Voiding March now reverses what is left of it: 12.85 - 9.90.
    void = services.void_invoice(march, now=at(2026, 5, 2))
    assert (void.number, void.total) == ("CN-2026-000002", Decimal("-2.95"))
    assert sorted(void.lines.values_list("amount", flat=True)) == [
        Decimal("-12.850000"),
        Decimal("9.900000"),
    ]


def test_a_late_report_that_finds_more_usage_is_a_line_on_the_open_month(world, tenant):
    other = world.running(tenant, at(2026, 3, 2, 10))
    walk(other, [S.STOPPING, S.STOPPED], at(2026, 3, 2, 11))  # 0.90
    box = world.instance(tenant, when=at(2026, 3, 31, 20))
    move(box, S.PROVISIONING, at(2026, 3, 31, 20))  # waits for its agent's word
    services.run_meter(at(2026, 4, 1, 0, 20))
    services.finalize_due(at(2026, 4, 1, 0, 20))
    march = Invoice.objects.get(tenant=tenant, kind="invoice", month=MARCH)
    assert (march.number, march.total) == ("GC-2026-000001", Decimal("0.90"))
    # At 01:00 the agent's late batch says the workload ran from 20:00: 4 h more of March.
    move(box, S.RUNNING, at(2026, 3, 31, 20))
    walk(box, [S.STOPPING, S.STOPPED], at(2026, 4, 1, 1))
    services.run_meter(at(2026, 4, 1, 2))
    services.finalize_due(at(2026, 5, 1, 1))
    april = Invoice.objects.get(tenant=tenant, kind="invoice", month=APRIL)
    (fix,) = april.lines.filter(kind="gpu", description__startswith="Correction")
    assert (fix.seconds, fix.amount) == (4 * 3600, Decimal("3.600000"))
    assert "GC-2026-000001" in fix.description and box.name in fix.description
    assert april.total == Decimal("4.50")  # 01:00 of April, and March's 4 h
    assert not Invoice.objects.filter(kind="credit_note").exists()


@override_settings(BILLING_MINIMUM_SECONDS=1)
def test_a_month_of_nothing_to_pay_has_no_number(world, tenant, web):
    box = world.running(tenant, at(2026, 3, 10, 10))
    walk(box, [S.STOPPING, S.STOPPED], at(2026, 3, 10, 10, 0, 10))  # 10 s: 0.0025
    move(box, S.TERMINATING, at(2026, 3, 10, 11))
    move(box, S.TERMINATED, at(2026, 3, 10, 11))
    services.run_meter(at(2026, 4, 1, 1))
    services.finalize_due(at(2026, 4, 1, 1))
    services.finalize_due(at(2026, 4, 1, 2))
    march = Invoice.objects.get(tenant=tenant, kind="invoice", month=MARCH)
    assert (march.status, march.number, march.total) == ("finalized", None, Decimal("0.00"))
    assert march.nothing_to_pay
    page = web.get("/billing/invoices/").content.decode()
    assert "Nothing to pay" in page
    with pytest.raises(InvalidInvoiceState):
        services.void_invoice(march, now=at(2026, 4, 2))
    # The next invoice takes the first number: none was used up.
    world.running(tenant, at(2026, 4, 2))
    services.run_meter(at(2026, 5, 1, 1))
    services.finalize_due(at(2026, 5, 1, 1))
    april = Invoice.objects.get(tenant=tenant, kind="invoice", month=APRIL)
    assert april.number == "GC-2026-000001"
