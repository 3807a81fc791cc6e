"""An invoice's document (stored for an issued one, the month so far for a draft), and the
exports built from it: one invoice as CSV, JSON or PDF, and the operators' month export (a
CSV of every line, or a ZIP of PDFs)."""

import io
import zipfile
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime

from django.db.models import Prefetch, QuerySet
from django.utils import timezone

from billing import documents
from billing.issuing import configured_tax_rate, current_issuer
from billing.models import Invoice, InvoiceLine, month_bounds
from billing.rating import InvoiceTotals, invoice_totals
from billing.usage import SoFar, UsageLine, so_far, usage_report

DRAFT_NUMBER = "DRAFT"
NOTHING_TO_PAY = "NOTHING TO PAY"  # an issued month of 0.00: no number

EXPORT_FORMATS = {
    "csv": "text/csv; charset=utf-8",
    "json": "application/json",
    "pdf": "application/pdf",
}


@dataclass(frozen=True)
class Export:
    content: bytes
    content_type: str
    filename: str


def draft_totals(figure: SoFar) -> InvoiceTotals:
    """A draft's totals for its month so far (no credits yet: they apply at finalization),
    the totals its document shows for the same moment."""
    return invoice_totals([figure.amount], tax_rate=configured_tax_rate())


def with_so_far(rows: Iterable[Invoice], now: datetime | None = None) -> list[Invoice]:
    """``rows`` with each draft's month so far as of ``now`` (``draft.so_far``, a
    ``SoFar``, and ``draft.so_far_totals``), rated for all drafts of a month at once: what
    lists (the tenant's, the admin's, the API's) show for a draft instead of its stored
    zeros."""
    now = now or timezone.now()
    rows = list(rows)
    drafts: dict[date, list[Invoice]] = defaultdict(list)
    for invoice in rows:
        if invoice.is_draft:
            drafts[invoice.month].append(invoice)
    for month, month_drafts in drafts.items():
        figures = so_far({draft.tenant_id for draft in month_drafts}, month, now)
        for draft in month_drafts:
            draft.so_far = figures[draft.tenant_id]
            draft.so_far_totals = draft_totals(draft.so_far)
    return rows


def draft_lines(invoice: Invoice, now: datetime | None = None) -> list[UsageLine]:
    return usage_report(invoice.tenant, invoice.month, now).lines


def document(invoice: Invoice, *, now: datetime | None = None) -> documents.Invoice:
    """The document of an invoice: stored for an issued one, the usage so far for a draft
    (its credits and number come at finalization)."""
    if invoice.is_draft:
        return _draft_document(invoice, now)
    return _issued_document(invoice)


def _draft_document(invoice: Invoice, now: datetime | None) -> documents.Invoice:
    start, end = month_bounds(invoice.month)
    tenant = invoice.tenant
    lines = [
        documents.InvoiceLine(
            description=line.description,
            instance_name=line.instance_name,
            spec_code=line.spec_code,
            seconds=line.seconds,
            unit_price_per_hour=line.unit_price_per_hour,
            amount=line.amount,
            gib=line.gib,
            month_seconds=line.month_seconds,
            unit_price_per_gib_month=line.unit_price_per_gib_month,
        )
        for line in draft_lines(invoice, now)
    ]
    tax_rate = configured_tax_rate()
    totals = invoice_totals((line.amount for line in lines), tax_rate=tax_rate)
    return documents.Invoice(
        number=DRAFT_NUMBER,
        status=documents.InvoiceStatus.DRAFT,
        issuer=current_issuer(),
        tenant=documents.BillTo(name=tenant.name, slug=tenant.slug),
        period_start=start,
        period_end=end,
        issued_at=None,
        lines=tuple(lines),
        subtotal=totals.subtotal,
        credits_applied=totals.credits_applied,
        tax_rate=tax_rate,
        tax_amount=totals.tax,
        total=totals.total,
        currency=invoice.currency,
    )


def _issued_document(invoice: Invoice) -> documents.Invoice:
    start, end = month_bounds(invoice.month)
    stored = getattr(invoice, "_prefetched_objects_cache", {}).get("lines")
    rows = list(stored) if stored is not None else list(invoice.lines.order_by("position"))
    return documents.Invoice(
        number=invoice.number or NOTHING_TO_PAY,
        status=documents.InvoiceStatus(invoice.status),
        issuer=documents.Issuer(
            name=invoice.issuer_name,
            address_lines=tuple(invoice.issuer_address or ()),
            tax_id=invoice.issuer_tax_id or None,
        ),
        tenant=documents.BillTo(name=invoice.tenant_name, slug=invoice.tenant_slug),
        period_start=start,
        period_end=end,
        issued_at=invoice.issued_at,
        lines=tuple(
            documents.InvoiceLine(
                description=row.description,
                instance_name=row.instance_name,
                spec_code=row.spec_code,
                seconds=row.seconds,
                unit_price_per_hour=row.unit_price_per_hour,
                amount=row.amount,
                gib=row.gib,
                month_seconds=row.month_seconds,
                unit_price_per_gib_month=row.unit_price_per_gib_month,
            )
            for row in rows
        ),
        subtotal=invoice.subtotal,
        credits_applied=invoice.credits_applied,
        tax_rate=invoice.tax_rate,
        tax_amount=invoice.tax_amount,
        total=invoice.total,
        currency=invoice.currency,
        document=invoice.kind,
        corrects=invoice.corrects.number if invoice.corrects_id else None,
    )


def export_basename(invoice: Invoice) -> str:
    prefix = "credit-note" if invoice.is_credit_note else "invoice"
    if invoice.number:
        return f"{prefix}-{invoice.number}"
    what = "draft" if invoice.is_draft else "nothing-to-pay"
    return f"{prefix}-{what}-{invoice.tenant.slug}-{invoice.month:%Y-%m}"


def render(doc: documents.Invoice, fmt: str, *, credit_note: bool = False) -> bytes:
    if fmt == "csv":
        return documents.render_invoice_csv(doc).encode()
    if fmt == "json":
        return documents.render_invoice_json(doc).encode()
    if fmt == "pdf":
        return documents.render_invoice_pdf(doc, title="Credit note" if credit_note else "Invoice")
    raise ValueError(f"unknown format {fmt!r}")


def export(invoice: Invoice, fmt: str, *, now: datetime | None = None) -> Export:
    """One invoice as CSV, JSON or PDF, with its content type and a file name."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown format {fmt!r}")
    content = render(document(invoice, now=now), fmt, credit_note=invoice.is_credit_note)
    return Export(content, EXPORT_FORMATS[fmt], f"{export_basename(invoice)}.{fmt}")


def issued(month: date | None = None) -> QuerySet:
    """Issued invoices and credit notes (of ``month``), numbers in order, lines prefetched."""
    invoices = Invoice.objects.exclude(status=Invoice.Status.DRAFT)
    if month is not None:
        invoices = invoices.filter(month=month)
    return (
        invoices.order_by("number")
        .select_related("corrects")
        .prefetch_related(
            Prefetch("lines", queryset=InvoiceLine.objects.order_by("invoice_id", "position"))
        )
    )


def month_export_csv(invoices: Iterable[Invoice]) -> str:
    """The operators' export of the given issued invoices and credit notes: their lines and
    totals (``documents.render_month_export_csv``)."""
    return documents.render_month_export_csv(
        document(invoice) for invoice in invoices if not invoice.is_draft
    )


def pdf_zip(invoices: Iterable[Invoice]) -> bytes:
    """A ZIP with one PDF per given issued invoice."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for invoice in invoices:
            if invoice.is_draft:
                continue
            pdf = render(document(invoice), "pdf", credit_note=invoice.is_credit_note)
            info = zipfile.ZipInfo(
                f"{export_basename(invoice)}.pdf", date_time=(1980, 1, 1, 0, 0, 0)
            )
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, pdf)
    return buffer.getvalue()
