"""Invoice documents (billing.documents): CSV, JSON and PDF, and the parsers back."""

import csv
import dataclasses
import io
import json
import subprocess
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pypdf import PdfReader

from billing import documents
from billing.documents import (
    BillTo,
    Invoice,
    InvoiceLine,
    InvoiceStatus,
    InvoiceSummary,
    Issuer,
    parse_invoice_csv,
    parse_invoice_json,
    render_invoice_csv,
    render_invoice_json,
    render_invoice_pdf,
    render_month_export_csv,
)
from billing.money import AS_RATED, format_money
from billing.rating import NaiveDatetimeError, invoice_totals, quantize_amount

ISSUER = Issuer("Northwind GPU Cloud GmbH", ("Musterstrasse 12", "10115 Berlin"), "DE123456789")
TENANT = BillTo("Acme Research Ltd.", "acme", ("1 Main Street", "Cambridge"))


def usage_line(seconds: int, price: str, instance: str = "train-1", spec: str = "a100-1g.10gb"):
    amount = quantize_amount(Decimal(seconds) * Decimal(price) / 3600)
    return InvoiceLine(f"GPU usage {spec}", instance, spec, seconds, Decimal(price), amount)


def make_invoice(
    lines,
    *,
    credit: str = "0",
    tax_rate: Decimal | None = None,
    number: str = "GC-2026-000123",
    status: InvoiceStatus = InvoiceStatus.FINALIZED,
    tenant: BillTo = TENANT,
) -> Invoice:
    totals = invoice_totals(
        [line.amount for line in lines], credit_available=Decimal(credit), tax_rate=tax_rate
    )
    return Invoice(
        number=number,
        status=status,
        issuer=ISSUER,
        tenant=tenant,
        period_start=datetime(2026, 3, 1, tzinfo=UTC),
        period_end=datetime(2026, 4, 1, tzinfo=UTC),
        issued_at=None if status is InvoiceStatus.DRAFT else datetime(2026, 4, 1, 2, tzinfo=UTC),
        lines=tuple(lines),
        subtotal=totals.subtotal,
        credits_applied=totals.credits_applied,
        tax_rate=tax_rate,
        tax_amount=totals.tax,
        total=totals.total,
    )


def summary_of(invoice: Invoice) -> InvoiceSummary:
    return InvoiceSummary(
        number=invoice.number,
        currency=invoice.currency,
        lines=invoice.lines,
        subtotal=invoice.subtotal,
        credits_applied=invoice.credits_applied,
        tax_amount=invoice.tax_amount,
        total=invoice.total,
    )


SAMPLE = make_invoice(
    [
        usage_line(62, "2.49"),
        usage_line(86_400 * 3 + 7, "24.80", '=HYPERLINK("http://evil")', "h100-80gb-x8"),
        usage_line(3_600, "0.3125", '\'quoted, "comma"', "a100-shared-250"),
    ],
    credit="10",
    tax_rate=Decimal("0.19"),
)


def test_invoice_checks_its_totals_and_times():
    with pytest.raises(ValueError, match="do not match"):
        dataclasses.replace(SAMPLE, total=SAMPLE.total + Decimal("0.01"))
    with pytest.raises(ValueError, match="do not match"):
        dataclasses.replace(SAMPLE, credits_applied=SAMPLE.subtotal + 1)
    with pytest.raises(TypeError, match="Decimal"):
        dataclasses.replace(SAMPLE, total=float(SAMPLE.total))
    with pytest.raises(NaiveDatetimeError, match="period_start"):
        dataclasses.replace(SAMPLE, period_start=datetime(2026, 3, 1))
    with pytest.raises(ValueError, match="6 places"):
        InvoiceLine("x", "i", "s", 1, Decimal(1), Decimal("0.0000001"))
    plus_one = timezone(timedelta(hours=1))
    shifted = dataclasses.replace(SAMPLE, issued_at=datetime(2026, 4, 1, 3, tzinfo=plus_one))
    assert shifted.issued_at == SAMPLE.issued_at
    assert shifted.issued_at.tzinfo is UTC


def test_csv_has_a_header_one_row_per_line_and_summary_rows():
    rows = list(csv.reader(io.StringIO(render_invoice_csv(SAMPLE))))
    assert rows[0][:3] == ["invoice_number", "row_type", "description"]
    assert [row[1] for row in rows[1:]] == ["line"] * 3 + ["subtotal", "credits", "tax", "total"]
    by_type = {row[1]: row for row in rows[1:]}
    amount = rows[0].index("amount")
    assert by_type["subtotal"][amount] == str(SAMPLE.subtotal)
    assert by_type["credits"][amount] == "-10.00"
    assert by_type["tax"][2] == "Tax 19%"
    assert by_type["total"][amount] == str(SAMPLE.total)
    assert rows[1][amount] == "0.042883"
    # tenant-chosen text cannot run as a spreadsheet formula
    assert rows[2][3] == '\'=HYPERLINK("http://evil")'


def test_csv_round_trip_gives_the_same_lines_and_totals():
    assert parse_invoice_csv(render_invoice_csv(SAMPLE)) == summary_of(SAMPLE)


def test_csv_parser_refuses_tampered_or_foreign_csv():
    text = render_invoice_csv(SAMPLE)
    with pytest.raises(ValueError, match="total"):
        parse_invoice_csv(text.replace(f",{SAMPLE.total},", f",{SAMPLE.total + 1},"))
    with pytest.raises(ValueError, match="header"):
        parse_invoice_csv("a,b\n1,2\n")
    without_tax = "".join(line for line in text.splitlines(True) if ",tax," not in line)
    with pytest.raises(ValueError, match="lacks summary rows"):
        parse_invoice_csv(without_tax)


def test_json_has_every_field_with_amounts_as_strings_and_iso_times():
    data = json.loads(render_invoice_json(SAMPLE))
    assert data["number"] == "GC-2026-000123"
    assert data["status"] == "finalized"
    assert data["currency"] == "USD"
    assert data["issuer"]["tax_id"] == "DE123456789"
    assert data["tenant"]["slug"] == "acme"
    assert data["period"] == {
        "start": "2026-03-01T00:00:00+00:00",
        "end": "2026-04-01T00:00:00+00:00",
    }
    assert data["issued_at"] == "2026-04-01T02:00:00+00:00"
    assert data["lines"][0]["amount"] == "0.042883"
    assert data["tax_rate"] == "0.19"
    for key in ("subtotal", "credits_applied", "tax_amount", "total"):
        assert data[key] == str(getattr(SAMPLE, key))

    def numbers(node, path=""):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from numbers(value, key)
        elif isinstance(node, list):
            for value in node:
                yield from numbers(value, path)
        elif isinstance(node, int | float) and not isinstance(node, bool):
            yield path, node

    assert {path for path, _ in numbers(data)} == {"seconds"}


def test_json_round_trip_gives_the_identical_invoice():
    assert parse_invoice_json(render_invoice_json(SAMPLE)) == SAMPLE
    draft = make_invoice([usage_line(30, "1")], status=InvoiceStatus.DRAFT)
    assert draft.issued_at is None
    assert parse_invoice_json(render_invoice_json(draft)) == draft


def test_json_parser_refuses_numbers_for_amounts():
    data = json.loads(render_invoice_json(SAMPLE))
    data["total"] = float(SAMPLE.total)
    with pytest.raises(ValueError, match="decimal string"):
        parse_invoice_json(json.dumps(data))


texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
lines_strategy = st.lists(
    st.builds(
        lambda description, instance, spec, seconds, price: InvoiceLine(
            description,
            instance,
            spec,
            seconds,
            price,
            quantize_amount(Decimal(seconds) * price / 3600),
        ),
        texts,
        texts,
        texts,
        st.integers(0, 40 * 86_400),
        st.decimals(min_value=0, max_value=50, places=4),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(
    lines_strategy,
    st.decimals(min_value=0, max_value=500, places=2),
    st.one_of(st.none(), st.decimals(min_value=0, max_value=Decimal("0.3"), places=3)),
)
def test_documents_round_trip_for_any_lines(lines, credit, tax_rate):
    invoice = make_invoice(lines, credit=str(credit), tax_rate=tax_rate)
    assert parse_invoice_csv(render_invoice_csv(invoice)) == summary_of(invoice)
    assert parse_invoice_json(render_invoice_json(invoice)) == invoice


def test_month_export_has_lines_and_totals_of_every_invoice():
    other = make_invoice(
        [usage_line(600, "24.80", "big-run")],
        number="GC-2026-000124",
        tenant=BillTo("Globex", "globex"),
    )
    rows = list(csv.DictReader(io.StringIO(render_month_export_csv([SAMPLE, other]))))
    summary = ["subtotal", "credits", "tax", "total"]
    assert [(row["invoice_number"], row["row_type"]) for row in rows] == [
        *[("GC-2026-000123", kind) for kind in ["line"] * 3 + summary],
        *[("GC-2026-000124", kind) for kind in ["line", *summary]],
    ]
    line = rows[7]
    assert (line["tenant_slug"], line["instance"], line["document"]) == (
        "globex",
        "big-run",
        "invoice",
    )
    assert line["period_start"] == "2026-03-01T00:00:00+00:00"
    for invoice in (SAMPLE, other):
        mine = {kind: [] for kind in ["line", *summary]}
        for row in rows:
            if row["invoice_number"] == invoice.number:
                mine[row["row_type"]].append(Decimal(row["amount"]))
        assert invoice_totals(mine["line"]).subtotal == invoice.subtotal == mine["subtotal"][0]
        assert mine["subtotal"][0] + mine["credits"][0] + mine["tax"][0] == mine["total"][0]
        assert mine["total"] == [invoice.total]


def pdf_text(data: bytes) -> tuple[int, str]:
    reader = PdfReader(io.BytesIO(data))
    return len(reader.pages), "\n".join(page.extract_text() for page in reader.pages)


def test_pdf_opens_and_shows_the_number_and_the_total():
    data = render_invoice_pdf(SAMPLE)
    assert data.startswith(b"%PDF")
    pages, text = pdf_text(data)
    assert pages == 1
    assert "GC-2026-000123" in text
    assert "INVOICE" in text
    assert format_money(SAMPLE.total, "USD") in text
    assert "Acme Research Ltd." in text
    assert render_invoice_pdf(SAMPLE) == data  # deterministic


@pytest.mark.slow
def test_pdf_with_hundreds_of_lines_and_long_names_repeats_the_table_header():
    long_name = "a-very-long-instance-name-" * 12
    lines = [
        usage_line(60 + index * 97, "2.49", long_name if index % 9 == 0 else f"run-{index:03d}")
        for index in range(230)
    ]
    lines.append(
        InvoiceLine(
            "GPU usage 東京 — «ночь» " * 10, "名前", "spec", 60, Decimal(1), Decimal("0.016667")
        )
    )
    invoice = make_invoice(lines, credit="5", tax_rate=Decimal("0.2"))
    pages, text = pdf_text(render_invoice_pdf(invoice))
    assert pages > 3
    reader = PdfReader(io.BytesIO(render_invoice_pdf(invoice)))
    for page in reader.pages:
        assert "Description" in page.extract_text()
    assert long_name in "".join(text.split())  # wrapped, never cut
    assert format_money(invoice.total, "USD") in text
    assert f"page {pages} of {pages}" in text


def test_pdf_marks_drafts_and_void_invoices():
    for status in (InvoiceStatus.DRAFT, InvoiceStatus.VOID):
        _, text = pdf_text(render_invoice_pdf(make_invoice([usage_line(30, "1")], status=status)))
        assert status.value.upper() in text


def pdftotext(data: bytes) -> str:
    return subprocess.run(
        ["pdftotext", "-", "-"], input=data, capture_output=True, check=True
    ).stdout.decode()


@pytest.mark.integration
def test_pdf_draws_every_name_whole_in_unicode_and_matches_the_csv():
    """Issue 27, item 7: no '?' for CJK or Latin Extended, no two names cut to one, no spec
    code cut: a long cell wraps (before a hyphen), so its lines run together give the CSV's
    text, and each line's amount is there in the money format."""
    tenant = BillTo("株式会社 東京AI Łódź Ğ", "tokyo-ai", ("1-2-3 Chiyoda", "Tokyo"))
    first = "llama-70b-finetune-run-2026-05-01-experiment-alpha-v2-seed-0001"
    second = first[:-1] + "2"
    spec = "h100-sxm5-80gb-x8-nvlink-infiniband-ndr400-premium"
    assert len(first) == len(second) == 63
    lines = [usage_line(3_600, "24.80", first, spec), usage_line(61, "24.80", second, spec)]
    invoice = make_invoice(lines, tenant=tenant, credit="3", tax_rate=Decimal("0.1"))
    text = pdftotext(render_invoice_pdf(invoice))
    assert tenant.name in text.splitlines()
    assert "?" not in text and "..." not in text
    run_together = "".join(text.split())
    assert run_together.count(first) == run_together.count(second) == 1
    rows = list(csv.DictReader(io.StringIO(render_invoice_csv(invoice))))
    for row in rows:
        if row["row_type"] == "line":
            money = format_money(row["amount"], row["currency"], AS_RATED)
            cells = (row["description"], row["instance"], row["spec"], money)
        else:
            cells = (format_money(row["amount"], row["currency"]),)
        for cell in cells:
            assert "".join(cell.split()) in run_together, cell


def test_pdf_names_the_package_of_a_missing_font(monkeypatch):
    family, style, _, package = documents._FALLBACK_FILE
    monkeypatch.setattr(
        documents, "_FALLBACK_FILE", (family, style, "/nonexistent/wqy.ttc", package)
    )
    with pytest.raises(documents.MissingFont, match="install the Debian package fonts-wqy"):
        render_invoice_pdf(SAMPLE)
