from decimal import Decimal

from django import template
from django.conf import settings

from billing.services import stopped_disk_cost_per_month

register = template.Library()


@register.filter
def money(value) -> str:
    """An amount in cents with thousands separators (half-up), e.g. 1,234.50."""
    if value is None or value == "":
        return "—"
    return f"{Decimal(value).quantize(Decimal('0.01'), rounding='ROUND_HALF_UP') + 0:,.2f}"


@register.filter
def micro(value) -> str:
    """An amount at 6 places, as billed."""
    if value is None or value == "":
        return "—"
    return f"{Decimal(value):,.6f}"


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
