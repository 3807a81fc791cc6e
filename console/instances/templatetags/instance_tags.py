from decimal import Decimal

from django import template

register = template.Library()


@register.filter
def price(value) -> str:
    """A price with at least two decimals and no more than it has: 0.9 → 0.90, 0.4567 stays."""
    if value in (None, ""):
        return ""
    value = Decimal(value).normalize()
    places = max(2, -value.as_tuple().exponent)
    return f"{value:.{places}f}"
