"""Invoice documents: CSV, JSON and PDF renderings of an ``Invoice``, and parsers back.

Pure Python (no Django): the service layer builds an ``Invoice`` from its rows and calls
``render_invoice_csv`` / ``render_invoice_json`` / ``render_invoice_pdf``, or
``render_month_export_csv`` for an operator's export of many invoices.

In CSV and JSON, amounts are plain decimal strings (line amounts at 6 places, totals in
cents), never floats or JSON numbers, with the currency in its own column or field; the PDF
shows them in the money format of every page (``billing.money``: ``1,234.50 USD``, lines at
6 places) and draws every text whole, in Unicode fonts. Times are ISO 8601 in UTC. Rendering
is deterministic: the same invoice always gives the same bytes.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Context, Decimal, InvalidOperation
from enum import StrEnum

from fpdf import FPDF
from fpdf.fonts import FontFace

from billing.money import AS_RATED, format_money
from billing.rating import (
    as_decimal,
    as_utc,
    invoice_totals,
    quantize_amount,
    reversed_totals,
    round_to_cents,
)

CSV_COLUMNS = (
    "invoice_number",
    "row_type",
    "description",
    "instance",
    "spec",
    "seconds",
    "unit_price_per_hour",
    "gib",
    "month_seconds",
    "unit_price_per_gib_month",
    "amount",
    "currency",
)
MONTH_EXPORT_COLUMNS = (
    "invoice_number",
    "document",
    "corrects",
    "status",
    "tenant_slug",
    "tenant_name",
    "period_start",
    "period_end",
    "currency",
    "row_type",
    "description",
    "instance",
    "spec",
    "seconds",
    "unit_price_per_hour",
    "gib",
    "month_seconds",
    "unit_price_per_gib_month",
    "amount",
)
_SUMMARY_ROW_TYPES = ("subtotal", "credits", "tax", "total")


class InvoiceStatus(StrEnum):
    DRAFT = "draft"
    FINALIZED = "finalized"
    PAID = "paid"
    VOID = "void"


@dataclass(frozen=True)
class Issuer:
    """The operator who issues the invoice."""

    name: str
    address_lines: tuple[str, ...] = ()
    tax_id: str | None = None


@dataclass(frozen=True)
class BillTo:
    """The tenant billed."""

    name: str
    slug: str
    address_lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class InvoiceLine:
    """A line; a correction of an issued invoice may take seconds back (negative).

    GPU time is priced per hour (``unit_price_per_hour``). Storage (a disk while not
    running, a volume, a snapshot) is priced per GiB-month, and its line shows what
    multiplies to its amount: ``gib`` × ``seconds`` / ``month_seconds`` (the seconds of its
    UTC month) × ``unit_price_per_gib_month``, rounded once to 6 places; it has no price per
    hour (one rounded to 6 places would not multiply)."""

    description: str
    instance_name: str
    spec_code: str
    seconds: int
    unit_price_per_hour: Decimal | None
    amount: Decimal
    gib: Decimal | None = None
    month_seconds: int | None = None
    unit_price_per_gib_month: Decimal | None = None

    def __post_init__(self) -> None:
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, int):
            raise TypeError("seconds must be an int")
        for name in ("unit_price_per_hour", "amount", "gib", "unit_price_per_gib_month"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, as_decimal(getattr(self, name), name))
        if self.amount != quantize_amount(self.amount):
            raise ValueError(f"a line amount has at most 6 places, got {self.amount}")


@dataclass(frozen=True)
class Invoice:
    """One tenant's invoice for one UTC month.

    ``period_end`` is exclusive (the next month's start). ``issued_at`` is None while the
    invoice is a draft. The totals must be what ``rating.invoice_totals`` gives for the
    lines, the credits applied and the tax rate (None: no tax); a credit note's (negative
    lines, credits returned as negative credits) are those of its negated lines, reversed.
    Either way ``subtotal - credits_applied + tax_amount == total``.
    """

    number: str
    status: InvoiceStatus
    issuer: Issuer
    tenant: BillTo
    period_start: datetime
    period_end: datetime
    issued_at: datetime | None
    lines: tuple[InvoiceLine, ...]
    subtotal: Decimal
    credits_applied: Decimal
    tax_rate: Decimal | None
    tax_amount: Decimal
    total: Decimal
    currency: str = "USD"
    document: str = "invoice"  # or "credit_note"
    corrects: str | None = None  # a credit note: the number of the invoice it voids

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", InvoiceStatus(self.status))
        object.__setattr__(self, "lines", tuple(self.lines))
        object.__setattr__(self, "period_start", as_utc(self.period_start, "period_start"))
        object.__setattr__(self, "period_end", as_utc(self.period_end, "period_end"))
        if self.period_end <= self.period_start:
            raise ValueError("period_end must follow period_start")
        if self.issued_at is not None:
            object.__setattr__(self, "issued_at", as_utc(self.issued_at, "issued_at"))
        for name in ("subtotal", "credits_applied", "tax_amount", "total"):
            object.__setattr__(self, name, as_decimal(getattr(self, name), name))
        reverse = self.subtotal < 0 or self.credits_applied < 0
        sign = -1 if reverse else 1
        expected = invoice_totals(
            (sign * line.amount for line in self.lines),
            credit_available=sign * self.credits_applied,
            tax_rate=self.tax_rate,
        )
        if reverse:
            expected = reversed_totals(expected)
        given = (self.subtotal, self.credits_applied, self.tax_amount, self.total)
        if given != (expected.subtotal, expected.credits_applied, expected.tax, expected.total):
            raise ValueError(
                f"invoice {self.number} totals {given} do not match its lines: {expected}"
            )


@dataclass(frozen=True)
class InvoiceSummary:
    """What an invoice CSV carries: its number, currency, lines and totals."""

    number: str
    currency: str
    lines: tuple[InvoiceLine, ...]
    subtotal: Decimal
    credits_applied: Decimal
    tax_amount: Decimal
    total: Decimal

    def __post_init__(self) -> None:
        if round_to_cents(sum((line.amount for line in self.lines), Decimal(0))) != self.subtotal:
            raise ValueError(f"subtotal {self.subtotal} is not the lines' sum in cents")
        if self.subtotal - self.credits_applied + self.tax_amount != self.total:
            raise ValueError(f"total {self.total} is not subtotal - credits + tax")


# --- text helpers ------------------------------------------------------------------------


def _plain(value: Decimal) -> str:
    """A Decimal as a plain string, never in exponent notation."""
    return format(value, "f")


def _parse_decimal(text: str, name: str) -> Decimal:
    if not isinstance(text, str):
        raise ValueError(f"{name} must be a decimal string, got {text!r}")
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"{name} is not a decimal: {text!r}") from None
    return as_decimal(value, name)


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "'")


def _csv_text(text: str) -> str:
    """Defuse spreadsheet formulas in tenant-chosen text by prefixing a quote.

    Text that already starts with a quote is prefixed too, so ``_csv_text_back`` inverts
    this exactly.
    """
    return f"'{text}" if text.startswith(_FORMULA_STARTS) else text


def _csv_text_back(text: str) -> str:
    return text[1:] if text.startswith("'") else text


def _optional(value) -> str:
    return "" if value is None else _plain(value) if isinstance(value, Decimal) else str(value)


def _parse_optional(text: str | None, name: str) -> Decimal | None:
    return None if text in ("", None) else _parse_decimal(text, name)


def _line_cells(line: InvoiceLine) -> list[str]:
    return [
        _csv_text(line.description),
        _csv_text(line.instance_name),
        _csv_text(line.spec_code),
        str(line.seconds),
        _optional(line.unit_price_per_hour),
        _optional(line.gib),
        _optional(line.month_seconds),
        _optional(line.unit_price_per_gib_month),
        _plain(line.amount),
    ]


def _write_csv(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


# --- CSV ---------------------------------------------------------------------------------


def _summary_cells(invoice: Invoice) -> list[tuple[str, list[str]]]:
    """(row type, line cells) of the subtotal, credits (negative), tax and total rows."""
    tax_label = "Tax" if invoice.tax_rate is None else f"Tax {_percent(invoice.tax_rate)}"
    summary = (
        ("subtotal", "Subtotal", invoice.subtotal),
        ("credits", "Credits applied", -invoice.credits_applied + 0),  # + 0: never -0.00
        ("tax", tax_label, invoice.tax_amount),
        ("total", "Total", invoice.total),
    )
    blank = [""] * 7
    return [(kind, [label, *blank, _plain(amount)]) for kind, label, amount in summary]


def render_invoice_csv(invoice: Invoice) -> str:
    """One row per line, then subtotal, credits (negative), tax and total rows."""
    number, currency = _csv_text(invoice.number), invoice.currency
    rows = [[number, "line", *_line_cells(line), currency] for line in invoice.lines]
    rows.extend([number, kind, *cells, currency] for kind, cells in _summary_cells(invoice))
    return _write_csv(CSV_COLUMNS, rows)


def parse_invoice_csv(text: str) -> InvoiceSummary:
    """Read back what ``render_invoice_csv`` wrote; raise ValueError on anything else."""
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != CSV_COLUMNS:
        raise ValueError(f"unexpected CSV header {reader.fieldnames}")
    rows = list(reader)
    if not rows:
        raise ValueError("the CSV has no rows")
    numbers = {row["invoice_number"] for row in rows}
    currencies = {row["currency"] for row in rows}
    if len(numbers) != 1 or len(currencies) != 1:
        raise ValueError("the CSV mixes invoices or currencies")
    lines = []
    totals: dict[str, Decimal] = {}
    for row in rows:
        row_type = row["row_type"]
        if row_type == "line":
            lines.append(
                InvoiceLine(
                    description=_csv_text_back(row["description"]),
                    instance_name=_csv_text_back(row["instance"]),
                    spec_code=_csv_text_back(row["spec"]),
                    seconds=int(row["seconds"]),
                    unit_price_per_hour=_parse_optional(row["unit_price_per_hour"], "unit price"),
                    amount=_parse_decimal(row["amount"], "amount"),
                    gib=_parse_optional(row["gib"], "gib"),
                    month_seconds=int(row["month_seconds"]) if row["month_seconds"] else None,
                    unit_price_per_gib_month=_parse_optional(
                        row["unit_price_per_gib_month"], "unit price per GiB-month"
                    ),
                )
            )
        elif row_type in _SUMMARY_ROW_TYPES and row_type not in totals:
            totals[row_type] = _parse_decimal(row["amount"], row_type)
        else:
            raise ValueError(f"unexpected or repeated row type {row_type!r}")
    if missing := set(_SUMMARY_ROW_TYPES) - totals.keys():
        raise ValueError(f"the CSV lacks summary rows {sorted(missing)}")
    return InvoiceSummary(
        number=_csv_text_back(numbers.pop()),
        currency=currencies.pop(),
        lines=tuple(lines),
        subtotal=totals["subtotal"],
        credits_applied=-totals["credits"],
        tax_amount=totals["tax"],
        total=totals["total"],
    )


def render_month_export_csv(invoices: Iterable[Invoice]) -> str:
    """Operators' export of invoices and credit notes: for each, its line rows, then its
    subtotal, credits (negative), tax and total rows, as in the invoice CSV. The total rows
    sum to what was invoiced net: a void invoice and its credit note cancel out."""
    rows = []
    for invoice in invoices:
        head = [
            _csv_text(invoice.number),
            invoice.document,
            _csv_text(invoice.corrects or ""),
            invoice.status.value,
            _csv_text(invoice.tenant.slug),
            _csv_text(invoice.tenant.name),
            invoice.period_start.isoformat(),
            invoice.period_end.isoformat(),
            invoice.currency,
        ]
        rows.extend([*head, "line", *_line_cells(line)] for line in invoice.lines)
        rows.extend([*head, kind, *cells] for kind, cells in _summary_cells(invoice))
    return _write_csv(MONTH_EXPORT_COLUMNS, rows)


# --- JSON --------------------------------------------------------------------------------


def render_invoice_json(invoice: Invoice) -> str:
    """Every field; amounts as decimal strings, times as ISO 8601."""
    document = {
        "number": invoice.number,
        "document": invoice.document,
        "corrects": invoice.corrects,
        "status": invoice.status.value,
        "currency": invoice.currency,
        "issuer": {
            "name": invoice.issuer.name,
            "address_lines": list(invoice.issuer.address_lines),
            "tax_id": invoice.issuer.tax_id,
        },
        "tenant": {
            "name": invoice.tenant.name,
            "slug": invoice.tenant.slug,
            "address_lines": list(invoice.tenant.address_lines),
        },
        "period": {
            "start": invoice.period_start.isoformat(),
            "end": invoice.period_end.isoformat(),
        },
        "issued_at": None if invoice.issued_at is None else invoice.issued_at.isoformat(),
        "lines": [
            {
                "description": line.description,
                "instance_name": line.instance_name,
                "spec_code": line.spec_code,
                "seconds": line.seconds,
                "unit_price_per_hour": _optional(line.unit_price_per_hour) or None,
                "gib": _optional(line.gib) or None,
                "month_seconds": line.month_seconds,
                "unit_price_per_gib_month": _optional(line.unit_price_per_gib_month) or None,
                "amount": _plain(line.amount),
            }
            for line in invoice.lines
        ],
        "subtotal": _plain(invoice.subtotal),
        "credits_applied": _plain(invoice.credits_applied),
        "tax_rate": None if invoice.tax_rate is None else _plain(invoice.tax_rate),
        "tax_amount": _plain(invoice.tax_amount),
        "total": _plain(invoice.total),
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def _parse_time(text: str, name: str) -> datetime:
    if not isinstance(text, str):
        raise ValueError(f"{name} must be an ISO 8601 string, got {text!r}")
    return as_utc(datetime.fromisoformat(text), name)


def parse_invoice_json(text: str) -> Invoice:
    """Read back what ``render_invoice_json`` wrote; amounts must be strings."""
    data = json.loads(text)
    issuer, tenant = data["issuer"], data["tenant"]
    return Invoice(
        number=data["number"],
        status=InvoiceStatus(data["status"]),
        issuer=Issuer(
            name=issuer["name"],
            address_lines=tuple(issuer["address_lines"]),
            tax_id=issuer["tax_id"],
        ),
        tenant=BillTo(
            name=tenant["name"], slug=tenant["slug"], address_lines=tuple(tenant["address_lines"])
        ),
        period_start=_parse_time(data["period"]["start"], "period start"),
        period_end=_parse_time(data["period"]["end"], "period end"),
        issued_at=None
        if data["issued_at"] is None
        else _parse_time(data["issued_at"], "issued_at"),
        lines=tuple(
            InvoiceLine(
                description=line["description"],
                instance_name=line["instance_name"],
                spec_code=line["spec_code"],
                seconds=line["seconds"],
                unit_price_per_hour=_parse_optional(line["unit_price_per_hour"], "unit price"),
                amount=_parse_decimal(line["amount"], "amount"),
                gib=_parse_optional(line.get("gib"), "gib"),
                month_seconds=line.get("month_seconds"),
                unit_price_per_gib_month=_parse_optional(
                    line.get("unit_price_per_gib_month"), "unit price per GiB-month"
                ),
            )
            for line in data["lines"]
        ),
        subtotal=_parse_decimal(data["subtotal"], "subtotal"),
        credits_applied=_parse_decimal(data["credits_applied"], "credits_applied"),
        tax_rate=None if data["tax_rate"] is None else _parse_decimal(data["tax_rate"], "tax_rate"),
        tax_amount=_parse_decimal(data["tax_amount"], "tax_amount"),
        total=_parse_decimal(data["total"], "total"),
        currency=data["currency"],
        document=data.get("document", "invoice"),
        corrects=data.get("corrects"),
    )


# --- PDF ---------------------------------------------------------------------------------

_INK = (33, 37, 41)
_MUTED = (108, 117, 125)
_ACCENT = (31, 78, 121)
_RULE = (206, 212, 218)
_HEADING_FILL = (233, 238, 244)
_ALERT = (176, 32, 32)
_FONT = "dejavu"
_FALLBACK_FONT = "wqy"
# (family, style, file, the Debian package that ships it): DejaVu Sans for Latin, Greek and
# Cyrillic; WenQuanYi Micro Hei for any character DejaVu lacks (CJK: 株式会社 東京), loaded
# only for the invoices that need it (it takes half a second).
_FONT_FILES = (
    (_FONT, "", "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "fonts-dejavu-core"),
    (_FONT, "B", "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf", "fonts-dejavu-core"),
)
_FALLBACK_FILE = (
    _FALLBACK_FONT,
    "",
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "fonts-wqy-microhei",
)
# Description, instance, spec, seconds, price per hour, amount (mm on a 180 mm table).
_COLUMN_WIDTHS = (36, 36, 28, 18, 28, 34)
_CELL_PADDING = 1.5  # mm, left and right


class MissingFont(RuntimeError):
    """A font file the invoice PDF draws with is not installed."""


def _pdf_text(text: str) -> str:
    """Text on one line (runs of whitespace as one space); long text wraps, never cut."""
    return " ".join(text.split())


def _wrap(pdf: FPDF, text: str, width: float) -> str:
    """``text`` in lines that fit ``width`` (mm, in the current font), broken after spaces
    and before hyphens, so that names such as ``llama-70b-finetune-run-2026-05-01`` wrap
    between their parts (no line ends with a hyphen: text extractors would take it for a
    hyphenated word and drop it); a part wider than a line is broken by the table."""
    lines = [""]
    for part in filter(None, re.split(r"(?<=\s)|(?=-)", _pdf_text(text))):
        if lines[-1] and pdf.get_string_width((lines[-1] + part).rstrip()) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(line.rstrip() for line in lines)


def _percent(rate: Decimal) -> str:
    return f"{_plain((rate * 100).normalize())}%"


def _day(moment: datetime) -> str:
    return f"{moment.day} {moment:%b %Y}"


def _period_text(invoice: Invoice) -> str:
    last_day = invoice.period_end - timedelta(microseconds=1)
    return f"{_day(invoice.period_start)} - {_day(last_day)}"


def _texts(invoice: Invoice, title: str) -> Iterable[str]:
    """Every text of the invoice's own that the PDF draws."""
    issuer, tenant = invoice.issuer, invoice.tenant
    yield from (title, invoice.number, invoice.currency, issuer.name, issuer.tax_id or "")
    yield from (tenant.name, tenant.slug, *issuer.address_lines, *tenant.address_lines)
    for line in invoice.lines:
        yield from (storage_text(line), line.instance_name, line.spec_code)


class _InvoicePDF(FPDF):
    def __init__(self, invoice: Invoice, title: str = "Invoice") -> None:
        super().__init__(format="A4")
        for _, _, path, package in (*_FONT_FILES, _FALLBACK_FILE):
            if not os.path.isfile(path):
                raise MissingFont(
                    f"invoice PDFs need the font {path}: install the Debian package {package}"
                )
        for family, style, path, _ in _FONT_FILES:
            self.add_font(family, style, path)
        drawn = {ord(char) for char in "".join(_texts(invoice, title))}
        if any(drawn - self.fonts[key].cmap.keys() for key in (_FONT, f"{_FONT}B")):
            self.add_font(*_FALLBACK_FILE[:3])
            self.set_fallback_fonts([_FALLBACK_FONT], exact_match=False)
        self.invoice = invoice
        self.title_text = title
        self.set_margins(15, 15, 15)
        self.set_auto_page_break(auto=True, margin=22)

    def header(self) -> None:
        if self.page_no() > 1:
            self.set_font(_FONT, "", 8)
            self.set_text_color(*_MUTED)
            self.cell(0, 5, f"{self.title_text} {self.invoice.number} (continued)")
            self.ln(9)

    def footer(self) -> None:
        self.set_y(-15)
        self.set_draw_color(*_RULE)
        self.line(self.l_margin, self.get_y(), self.w - self.r_margin, self.get_y())
        self.set_font(_FONT, "", 7.5)
        self.set_text_color(*_MUTED)
        issuer = self.invoice.issuer
        left = issuer.name if issuer.tax_id is None else f"{issuer.name} - Tax ID {issuer.tax_id}"
        page = f"{self.invoice.number} - page {self.page_no()} of {{nb}}"
        self.multi_cell(0, 3.5, _pdf_text(left), new_x="LMARGIN", new_y="NEXT")
        self.cell(0, 3.5, page, align="R")


def _lines(pdf: FPDF, width: float, height: float, texts: Iterable[str], **kwargs) -> None:
    """Each text wrapped to ``width`` below the one before, from the current x."""
    x = pdf.get_x()
    for text in texts:
        pdf.set_x(x)
        pdf.multi_cell(width, height, _pdf_text(text), new_x="LEFT", new_y="NEXT", **kwargs)


def _issuer_block(pdf: FPDF, invoice: Invoice) -> float:
    pdf.set_xy(15, 15)
    pdf.set_text_color(*_INK)
    pdf.set_font(_FONT, "B", 13)
    _lines(pdf, 95, 7, [invoice.issuer.name])
    pdf.set_font(_FONT, "", 9)
    pdf.set_text_color(*_MUTED)
    tax_id = () if invoice.issuer.tax_id is None else (f"Tax ID: {invoice.issuer.tax_id}",)
    _lines(pdf, 95, 4.6, [*invoice.issuer.address_lines, *tax_id])
    return pdf.get_y()


def _title_block(pdf: _InvoicePDF, invoice: Invoice) -> float:
    pdf.set_xy(115, 13)
    pdf.set_font(_FONT, "B", 24)
    pdf.set_text_color(*_ACCENT)
    pdf.cell(80, 11, pdf.title_text.upper(), align="R", new_x="LEFT", new_y="NEXT")
    issued = "-" if invoice.issued_at is None else _day(invoice.issued_at)
    facts = (
        (f"{pdf.title_text} no.", invoice.number),
        ("Date", issued),
        ("Period", _period_text(invoice)),
        ("Currency", invoice.currency),
    )
    for label, value in facts:
        pdf.set_x(115)
        pdf.set_font(_FONT, "", 9)
        pdf.set_text_color(*_MUTED)
        pdf.cell(26, 5, label, align="R")
        pdf.set_font(_FONT, "B", 9)
        pdf.set_text_color(*_INK)
        pdf.multi_cell(54, 5, _pdf_text(value), align="R", new_x="LMARGIN", new_y="NEXT")
    if invoice.status is not InvoiceStatus.FINALIZED:
        pdf.set_x(115)
        pdf.set_font(_FONT, "B", 11)
        pdf.set_text_color(*(_ACCENT if invoice.status is InvoiceStatus.PAID else _ALERT))
        pdf.cell(80, 7, invoice.status.value.upper(), align="R", new_x="LMARGIN", new_y="NEXT")
    return pdf.get_y()


def _bill_to_block(pdf: FPDF, invoice: Invoice, top: float) -> None:
    pdf.set_xy(15, max(top + 4, 52))
    pdf.set_font(_FONT, "B", 8)
    pdf.set_text_color(*_MUTED)
    pdf.cell(95, 5, "BILL TO", new_x="LMARGIN", new_y="NEXT")
    pdf.set_font(_FONT, "B", 11)
    pdf.set_text_color(*_INK)
    _lines(pdf, 95, 6, [invoice.tenant.name])
    pdf.set_font(_FONT, "", 9)
    pdf.set_text_color(*_MUTED)
    _lines(pdf, 95, 4.6, [f"Account: {invoice.tenant.slug}", *invoice.tenant.address_lines])
    pdf.set_y(max(pdf.get_y() + 6, 82))


def _lines_table(pdf: FPDF, invoice: Invoice) -> None:
    pdf.set_font(_FONT, "", 8)
    pdf.set_text_color(*_INK)
    pdf.set_draw_color(*_RULE)
    headings = ("Description", "Instance", "Spec", "Seconds", "Price", "Amount")
    with pdf.table(
        width=sum(_COLUMN_WIDTHS),
        col_widths=_COLUMN_WIDTHS,
        text_align=("LEFT", "LEFT", "LEFT", "RIGHT", "RIGHT", "RIGHT"),
        borders_layout="HORIZONTAL_LINES",
        headings_style=FontFace(emphasis="BOLD", fill_color=_HEADING_FILL),
        line_height=4.2,
        padding=(0.9, _CELL_PADDING),
        repeat_headings=1,
    ) as table:
        table.row(headings)
        for line in invoice.lines:
            texts = (storage_text(line), line.instance_name, line.spec_code)
            table.row(
                (
                    *(
                        _wrap(pdf, text, width - 2 * _CELL_PADDING)
                        for text, width in zip(texts, _COLUMN_WIDTHS, strict=False)
                    ),
                    f"{line.seconds:,}",
                    unit_price_text(line, invoice.currency),
                    format_money(line.amount, invoice.currency, AS_RATED),
                )
            )


_EXACT = Context(prec=60)  # a GiB figure of bytes has up to 30 decimal places


def gib_text(gib: Decimal) -> str:
    """GiB as exactly as they are billed (a snapshot's: its bytes / 2^30, every digit)."""
    return _plain(gib.normalize(_EXACT)) if gib != gib.to_integral_value() else f"{gib:.0f}"


def storage_text(line: InvoiceLine) -> str:
    """A line's description; a storage line's with the figures that multiply to its amount."""
    if line.gib is None:
        return line.description
    return (
        f"{line.description} ({gib_text(line.gib)} GiB × {line.seconds:,} s / "
        f"{line.month_seconds:,} s × {_plain(line.unit_price_per_gib_month.normalize())} "
        "per GiB-month)"
    )


def unit_price_text(line: InvoiceLine, currency: str) -> str:
    if line.gib is None:
        return f"{format_money(line.unit_price_per_hour, currency, AS_RATED)} / h"
    return f"{format_money(line.unit_price_per_gib_month, currency, AS_RATED)} / GiB-month"


def _totals_block(pdf: FPDF, invoice: Invoice) -> None:
    tax_label = "Tax" if invoice.tax_rate is None else f"Tax ({_percent(invoice.tax_rate)})"
    rows = (
        ("Subtotal", invoice.subtotal),
        ("Credits applied", -invoice.credits_applied),
        (tax_label, invoice.tax_amount),
    )
    if pdf.will_page_break(4 * 6 + 14):
        pdf.add_page()
    pdf.ln(4)
    for label, value in rows:
        pdf.set_x(105)
        pdf.set_font(_FONT, "", 9)
        pdf.set_text_color(*_MUTED)
        pdf.cell(40, 6, label)
        pdf.set_text_color(*_INK)
        pdf.cell(
            50, 6, format_money(value, invoice.currency), align="R", new_x="LMARGIN", new_y="NEXT"
        )
    pdf.set_draw_color(*_INK)
    pdf.line(105, pdf.get_y() + 0.5, 195, pdf.get_y() + 0.5)
    pdf.ln(1.5)
    pdf.set_x(105)
    pdf.set_font(_FONT, "B", 11)
    pdf.cell(40, 8, "Total")
    pdf.cell(
        50,
        8,
        format_money(invoice.total, invoice.currency),
        align="R",
        new_x="LMARGIN",
        new_y="NEXT",
    )
    pdf.ln(6)
    pdf.set_font(_FONT, "", 7.5)
    pdf.set_text_color(*_MUTED)
    pdf.multi_cell(
        0,
        4,
        "Usage is billed per second (rounded up, minimum per start). Line amounts and prices "
        "are shown to 6 decimal places; the subtotal is their sum rounded half-up to the cent. "
        "Times are UTC.",
    )


def render_invoice_pdf(invoice: Invoice, *, title: str = "Invoice") -> bytes:
    """An A4 invoice: issuer and title blocks, bill-to, the lines table (its header repeats
    on every page), the totals block and a footer with the page number. Every text is drawn
    whole (long text wraps) in Unicode fonts from Debian packages (``MissingFont`` names the
    package when one is not installed)."""
    pdf = _InvoicePDF(invoice, title)
    pdf.set_title(f"{title} {invoice.number}")
    pdf.set_author(invoice.issuer.name)
    pdf.set_creator("gpucloud")
    pdf.set_creation_date(invoice.issued_at or invoice.period_start)
    pdf.add_page()
    issuer_bottom = _issuer_block(pdf, invoice)
    title_bottom = _title_block(pdf, invoice)
    _bill_to_block(pdf, invoice, max(issuer_bottom, title_bottom))
    _lines_table(pdf, invoice)
    _totals_block(pdf, invoice)
    return bytes(pdf.output())
