"""The one money format of every page, the PDF, the budget emails and the CLI: the amount
with thousands separators, a space and the ISO currency code, e.g. ``1,234.50 USD``.

Two precisions: what is charged (an invoice's subtotal, credits, tax and total, a month so
far, a forecast, a budget, a credit, a monthly price) in cents, rounded half-up as invoices
round; what is rated per second (a line's amount, a price or cost per hour, and their sums
per instance, spec, day or month before rounding) at the 6 places it is stored at.

Pure Python (no Django); the CLI, its own program, repeats this function (tests hold the two
to the same output).
"""

from decimal import ROUND_HALF_UP, Decimal

CENTS = 2
AS_RATED = 6


def format_money(amount: Decimal | int | str, currency: str, places: int = CENTS) -> str:
    """``amount`` to ``places`` decimals (half-up) with the currency: ``0.002000 USD``."""
    value = Decimal(amount).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    return f"{value + 0:,.{places}f} {currency}"  # + 0: never -0.00
