"""One money format (billing.money), and the CLI's copy of it."""

from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from billing.money import AS_RATED, format_money
from cli.main import money as cli_money


def test_cents_half_up_with_the_currency_and_rated_amounts_at_six_places():
    assert format_money(Decimal("1234.5"), "USD") == "1,234.50 USD"
    assert format_money(Decimal("0.005"), "EUR") == "0.01 EUR"
    assert format_money(Decimal("-0.001"), "USD") == "0.00 USD"  # never -0.00
    assert format_money(Decimal("-10"), "USD") == "-10.00 USD"
    assert format_money(Decimal("0.00205"), "USD", AS_RATED) == "0.002050 USD"
    assert format_money("888888.816", "USD", AS_RATED) == "888,888.816000 USD"


@given(
    st.decimals(min_value=-(10**9), max_value=10**9, places=6, allow_nan=False),
    st.sampled_from([2, AS_RATED]),
)
def test_the_cli_formats_money_as_the_console_does(amount, places):
    assert cli_money(str(amount), "USD", places) == format_money(amount, "USD", places)
