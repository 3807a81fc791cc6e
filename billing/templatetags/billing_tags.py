from decimal import Decimal

from django import template
from django.conf import settings

from billing import documents
from billing.money import AS_RATED, format_money
from billing.services import stopped_disk_cost_per_month

register = template.Library()


@register.filter
def money(value, currency=None) -> str:
    """A charged amount in cents with the currency (``billing.money``): 1,234.50 USD."""
    if value is None or value == "":
        return "—"
    return format_money(value, currency or settings.BILLING_CURRENCY)


@register.filter
def micro(value, currency=None) -> str:
    """A rated amount or price at 6 places, as billed, with the currency: 0.002000 USD."""
    if value is None or value == "":
        return "—"
    return format_money(value, currency or settings.BILLING_CURRENCY, AS_RATED)


@register.filter
def duration(seconds) -> str:
    """Seconds as h:mm:ss (days as hours)."""
    seconds = int(seconds or 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours:,}:{minutes:02d}:{secs:02d}"


@register.filter
def stopped_disk_cost(instance) -> Decimal:
    """What the instance's disk costs per month while it is stopped (for its pages: instances
    shows billing's figures without importing billing)."""
    return stopped_disk_cost_per_month(instance)


@register.simple_tag
def currency() -> str:
    return settings.BILLING_CURRENCY


@register.filter
def line_text(line) -> str:
    """A line's description; a storage line's with the figures that multiply to its amount:
    GiB × seconds / seconds in the month × price per GiB-month."""
    return documents.storage_text(line)


@register.filter
def line_price(line, currency=None) -> str:
    """Per hour (GPU time) or per GiB-month (storage), at 6 places."""
    return documents.unit_price_text(line, currency or settings.BILLING_CURRENCY)
