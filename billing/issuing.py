"""What every issued invoice and credit note takes when it is issued: a number in its series,
the issuer and the tax rate (both from settings, copied onto the document so that it never
changes afterwards).

Numbers are ``GC-<year>-<000001>`` per year of issue (credit notes ``CN-…``), taken from an
``InvoiceSequence`` row locked in the issuing transaction, so they have no gaps.
"""

from decimal import Decimal

from django.conf import settings

from billing import documents
from billing.models import Invoice, InvoiceLine, gib_to_bytes
from billing.money import format_money
from billing.usage import UsageLine
from console.notices import notice

INVOICE_SERIES = "GC"
CREDIT_NOTE_SERIES = "CN"


def format_number(series: str, year: int, number: int) -> str:
    return f"{series}-{year}-{number:06d}"


def configured_tax_rate() -> Decimal | None:
    rate = Decimal(settings.BILLING_TAX_RATE or 0)
    return rate if rate > 0 else None


def announce_issued(invoice_ids: list[int]) -> None:
    """After the commit that issued them: an `invoice.issued` notice per numbered invoice and
    credit note (a month with nothing to pay has none)."""
    issued = Invoice.objects.filter(pk__in=invoice_ids, number__isnull=False)
    for invoice in issued.order_by("pk"):
        total = format_money(invoice.total, invoice.currency)
        what = invoice.get_kind_display()
        notice.send(
            sender=__name__,
            tenant=invoice.tenant_id,
            kind="invoice.issued",
            subject=invoice,
            text=f"{what} {invoice.number} for {invoice.month:%B %Y} was issued: {total}.",
            data={
                "invoice_id": invoice.pk,
                "number": invoice.number,
                "month": invoice.month.isoformat(),
                "total": str(invoice.total),
                "currency": invoice.currency,
            },
        )


def current_issuer() -> documents.Issuer:
    return documents.Issuer(
        name=settings.BILLING_ISSUER_NAME,
        address_lines=tuple(settings.BILLING_ISSUER_ADDRESS),
        tax_id=settings.BILLING_ISSUER_TAX_ID or None,
    )


def invoice_line(invoice_id: int, position: int, line: UsageLine) -> InvoiceLine:
    """A usage line as an issued document's line (an invoice's, a correction note's)."""
    return InvoiceLine(
        invoice_id=invoice_id,
        position=position,
        kind=line.kind,
        instance_id=line.instance_id or None,  # a volume's or a snapshot's line names none
        instance_name=line.instance_name,
        spec_code=line.spec_code,
        description=line.description,
        seconds=line.seconds,
        unit_price_per_hour=line.unit_price_per_hour,
        storage_bytes=None if line.gib is None else gib_to_bytes(line.gib),
        month_seconds=line.month_seconds,
        unit_price_per_gib_month=line.unit_price_per_gib_month,
        amount=line.amount,
    )
