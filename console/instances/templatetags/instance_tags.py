import shlex
from decimal import Decimal

from django import template

from console.instances import pull_progress, reasons

register = template.Library()


@register.filter
def argv(value) -> str:
    """A command (a list of arguments) as a shell line that gives that list back when pasted."""
    return shlex.join(value or [])


@register.filter
def cuda(image) -> str:
    """The CUDA version an image names; none for an image without CUDA ("-" or empty)."""
    version = (image.cuda_version or "").strip()
    return "" if version in ("", "-") else version


@register.filter
def reason_text(instance) -> str:
    """Why the instance is in its state, in words (reasons.py)."""
    return reasons.of_instance(instance)


@register.filter
def pull_bar(instance) -> dict | None:
    """Its image pull's bar (percent, summary with the ETA), while one is reported."""
    return pull_progress.describe(instance.pull_progress)


@register.filter
def price(value) -> str:
    """A price with at least two decimals and no more than it has: 0.9 → 0.90, 0.4567 stays."""
    if value in (None, ""):
        return ""
    value = Decimal(value).normalize()
    places = max(2, -value.as_tuple().exponent)
    return f"{value:.{places}f}"
