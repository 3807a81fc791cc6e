"""What every issued invoice and credit note takes when it is issued: a number in its series,
the issuer and the tax rate (both from settings, copied onto the document so that it never
changes afterwards).

Numbers are ``GC-<year>-<000001>`` per year of issue (credit notes ``CN-…``), taken from an
``InvoiceSequence`` row locked in the issuing transaction, so they have no gaps.
"""

from decimal import Decimal

from django.conf import settings

from billing import documents

INVOICE_SERIES = "GC"
CREDIT_NOTE_SERIES = "CN"


def format_number(series: str, year: int, number: int) -> str:
    return f"{series}-{year}-{number:06d}"


def configured_tax_rate() -> Decimal | None:
    rate = Decimal(settings.BILLING_TAX_RATE or 0)
    return rate if rate > 0 else None


def current_issuer() -> documents.Issuer:
    return documents.Issuer(
        name=settings.BILLING_ISSUER_NAME,
        address_lines=tuple(settings.BILLING_ISSUER_ADDRESS),
        tax_id=settings.BILLING_ISSUER_TAX_ID or None,
    )
