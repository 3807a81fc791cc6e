"""The arithmetic of usage (billing.rating): exact examples and properties.

The property tests check against an independent oracle built on ``fractions.Fraction``.
"""

import dataclasses
import itertools
import math
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.rating import (
    InvoiceTotals,
    NaiveDatetimeError,
    PricePoint,
    forecast_month_end,
    invoice_totals,
    iter_months,
    month_start,
    next_month_start,
    price_at,
    rate_disk,
    rate_segment,
    seconds_in_month,
)

LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def flat(price: str) -> list[PricePoint]:
    return [PricePoint(LONG_AGO, Decimal(price))]


# --- oracle ------------------------------------------------------------------------------


def exact_seconds(length: timedelta) -> Fraction:
    return Fraction(length // timedelta(microseconds=1), 1_000_000)


def half_up_6(value: Fraction) -> Decimal:
    assert value >= 0
    return Decimal(math.floor(value * 1_000_000 + Fraction(1, 2))) / 1_000_000


def half_up_cents(value: Fraction) -> Decimal:
    return Decimal(math.floor(value * 100 + Fraction(1, 2))) / 100


def oracle_price(history: list[PricePoint], moment: datetime) -> Decimal:
    best = None
    for point in history:
        if point.effective_from <= moment and (
            best is None or point.effective_from > best.effective_from
        ):
            best = point
    assert best is not None
    return best.price_per_hour


# --- exact examples ----------------------------------------------------------------------


def test_sixty_one_point_two_seconds_at_2_49_per_hour():
    start = at(2026, 3, 10, 12)
    (piece,) = rate_segment(start, start + timedelta(seconds=61.2), flat("2.49"))
    assert piece.seconds == 62
    assert piece.amount == Decimal("0.042883")
    assert str(piece.amount) == "0.042883"
    assert piece.month == at(2026, 3, 1)
    assert piece.is_final


def test_a_thirty_second_run_bills_the_sixty_second_minimum():
    start = at(2026, 3, 10, 12)
    (piece,) = rate_segment(start, start + timedelta(seconds=30), flat("2.49"))
    assert (piece.seconds, piece.amount) == (60, Decimal("0.041500"))


def test_minimum_is_configurable_and_zero_length_still_pays_it():
    start = at(2026, 3, 10, 12)
    assert [p.seconds for p in rate_segment(start, start, flat("1"))] == [60]
    assert [p.seconds for p in rate_segment(start, start, flat("1"), minimum_seconds=0)] == [0]
    half = start + timedelta(microseconds=1)
    assert [p.seconds for p in rate_segment(start, half, flat("1"), minimum_seconds=0)] == [1]


def test_segment_across_a_month_boundary_at_23_59_30():
    start = at(2026, 1, 31, 23, 59, 30)
    january, february = rate_segment(start, at(2026, 2, 1, 0, 10), flat("2.49"))
    # 30 s ran in January, and the 60 s minimum is incurred at the start, in January.
    assert (january.start, january.end, january.month) == (start, at(2026, 2, 1), at(2026, 1, 1))
    assert (february.start, february.month) == (at(2026, 2, 1), at(2026, 2, 1))
    assert (january.seconds, february.seconds) == (60, 570)
    assert january.amount == Decimal("0.041500")
    # the two pieces add up to the unsplit 630 s: 630 * 2.49 / 3600 = 0.43575
    assert february.amount == Decimal("0.394250")
    assert january.amount + february.amount == Decimal("0.435750")


def test_short_segment_across_a_month_boundary_bills_the_minimum_in_the_first_month():
    start = at(2026, 1, 31, 23, 59, 30)
    january, february = rate_segment(start, at(2026, 2, 1, 0, 0, 10), flat("2.49"))
    assert (january.seconds, february.seconds) == (60, 0)
    assert february.amount == Decimal("0.000000")


def test_open_segment_that_crossed_a_month_within_its_first_minute_keeps_its_first_piece():
    start = at(2026, 1, 31, 23, 59, 30)
    early = rate_segment(start, None, flat("2.49"), now=at(2026, 2, 1, 0, 0, 10))
    late = rate_segment(start, None, flat("2.49"), now=at(2026, 2, 1, 0, 5))
    closed = rate_segment(start, at(2026, 2, 1, 0, 0, 40), flat("2.49"))
    # the January piece settled when February began and never changes afterwards
    assert early[0] == late[0] == closed[0]
    assert (early[0].seconds, early[0].is_final) == (60, True)
    assert [p.seconds for p in early] == [60, 0]
    assert [p.seconds for p in late] == [60, 270]
    assert [p.seconds for p in closed] == [60, 10]  # 70 s in all


def test_long_segment_across_a_month_boundary_splits_by_time_once_past_the_minimum():
    start = at(2026, 1, 31, 23, 58)
    january, february = rate_segment(start, at(2026, 2, 1, 0, 10, 0, 1), flat("1"))
    assert (january.seconds, february.seconds) == (120, 601)


def test_price_change_splits_the_segment_and_each_piece_uses_its_price():
    prices = [PricePoint(LONG_AGO, Decimal("2.49")), PricePoint(at(2026, 3, 5, 10, 30), 3)]
    first, second = rate_segment(at(2026, 3, 5, 10), at(2026, 3, 5, 11), prices)
    assert (first.price_per_hour, first.seconds, first.amount) == (
        Decimal("2.49"),
        1800,
        Decimal("1.245000"),
    )
    assert (second.price_per_hour, second.seconds, second.amount) == (
        Decimal(3),
        1800,
        Decimal("1.500000"),
    )


def test_a_price_point_that_repeats_the_price_does_not_split():
    prices = [PricePoint(LONG_AGO, Decimal("2.49")), PricePoint(at(2026, 3, 5, 10, 30), 2)]
    prices.append(PricePoint(at(2026, 3, 5, 10, 20), Decimal("2.490")))
    pieces = rate_segment(at(2026, 3, 5, 10), at(2026, 3, 5, 10, 25), prices)
    assert len(pieces) == 1


def test_split_amounts_add_up_to_the_unsplit_amount():
    # At 0.0018/h one second costs 0.0000005: rounded on its own, each 1 s piece would cost
    # 0.000001; rounded cumulatively the two pieces cost what the unsplit 2 s cost.
    start = at(2026, 1, 31, 23, 59, 59)
    pieces = rate_segment(start, at(2026, 2, 1, 0, 0, 1), flat("0.0018"), minimum_seconds=0)
    assert [p.seconds for p in pieces] == [1, 1]
    assert [p.amount for p in pieces] == [Decimal("0.000001"), Decimal("0.000000")]


def test_open_segment_is_rated_up_to_now_and_its_last_piece_is_not_final():
    start = at(2026, 1, 31, 23)
    pieces = rate_segment(start, None, flat("1"), now=at(2026, 2, 1, 1))
    assert [(p.seconds, p.is_final) for p in pieces] == [(3600, True), (3600, False)]
    with pytest.raises(ValueError, match="open segment"):
        rate_segment(start, None, flat("1"))


def test_closed_segment_rated_as_of_an_earlier_now_matches_the_open_rating():
    start = at(2026, 1, 31, 23)
    now = at(2026, 2, 1, 0, 30)
    closed = rate_segment(start, at(2026, 2, 3), flat("1"), now=now)
    assert closed == rate_segment(start, None, flat("1"), now=now)


def test_invalid_windows_are_refused():
    with pytest.raises(ValueError, match="precedes"):
        rate_segment(at(2026, 3, 2), at(2026, 3, 1), flat("1"))
    with pytest.raises(ValueError, match="precedes"):
        rate_segment(at(2026, 3, 2), None, flat("1"), now=at(2026, 3, 1))
    with pytest.raises(ValueError, match="no price in effect"):
        rate_segment(at(2019, 3, 1), at(2019, 3, 2), flat("1"))
    with pytest.raises(ValueError, match="minimum_seconds"):
        rate_segment(at(2026, 3, 1), at(2026, 3, 2), flat("1"), minimum_seconds=-1)


def test_naive_datetimes_are_rejected_with_a_clear_error():
    naive = datetime(2026, 3, 1, 12)
    with pytest.raises(NaiveDatetimeError, match="start must be timezone-aware"):
        rate_segment(naive, at(2026, 3, 2), flat("1"))
    with pytest.raises(NaiveDatetimeError, match="end must be timezone-aware"):
        rate_segment(at(2026, 3, 1), naive, flat("1"))
    with pytest.raises(NaiveDatetimeError, match="now must be timezone-aware"):
        rate_segment(at(2026, 3, 1), None, flat("1"), now=naive)
    with pytest.raises(NaiveDatetimeError, match="effective_from"):
        PricePoint(naive, Decimal(1))
    with pytest.raises(NaiveDatetimeError):
        month_start(naive)
    with pytest.raises(NaiveDatetimeError):
        rate_disk(naive, None, 10, Decimal("0.1"), now=at(2026, 3, 1))
    with pytest.raises(NaiveDatetimeError):
        forecast_month_end(Decimal(0), Decimal(1), naive)


def test_floats_are_refused_for_money():
    with pytest.raises(TypeError, match="Decimal"):
        PricePoint(LONG_AGO, 2.49)
    with pytest.raises(TypeError, match="Decimal"):
        invoice_totals([0.1])
    with pytest.raises(TypeError, match="Decimal"):
        forecast_month_end(Decimal(0), 1.5, at(2026, 3, 1))


def test_other_timezones_are_converted_to_utc_and_months_are_utc_months():
    plus_two = timezone(timedelta(hours=2))
    start = datetime(2026, 2, 1, 1, 30, tzinfo=plus_two)  # 2026-01-31 23:30 UTC
    january, february = rate_segment(start, start + timedelta(hours=1), flat("1"))
    assert january.start == at(2026, 1, 31, 23, 30)
    assert january.start.tzinfo is UTC
    assert (january.month, january.seconds, february.seconds) == (at(2026, 1, 1), 1800, 1800)


def test_month_helpers():
    assert month_start(at(2026, 3, 31, 23, 59, 59, 999999)) == at(2026, 3, 1)
    assert next_month_start(at(2026, 12, 15)) == at(2027, 1, 1)
    assert next_month_start(at(2026, 12, 1)) == at(2027, 1, 1)
    assert seconds_in_month(at(2028, 2, 10)) == 29 * 86400
    assert seconds_in_month(at(2026, 2, 10)) == 28 * 86400
    assert list(iter_months(at(2025, 11, 20), at(2026, 2, 1))) == [
        at(2025, 11, 1),
        at(2025, 12, 1),
        at(2026, 1, 1),
    ]
    assert list(iter_months(at(2026, 2, 1), at(2026, 2, 1, 0, 0, 1))) == [at(2026, 2, 1)]
    assert list(iter_months(at(2026, 2, 1), at(2026, 2, 1))) == []
    with pytest.raises(ValueError, match="precedes"):
        list(iter_months(at(2026, 2, 2), at(2026, 2, 1)))


def test_price_at_and_duplicate_effective_times():
    prices = [PricePoint(at(2026, 3, 1), Decimal(2)), PricePoint(LONG_AGO, Decimal(1))]
    assert price_at(prices, at(2026, 2, 28)) == 1
    assert price_at(prices, at(2026, 3, 1)) == 2
    with pytest.raises(ValueError, match="two prices"):
        price_at([*prices, PricePoint(at(2026, 3, 1), Decimal(3))], at(2026, 3, 2))


def test_disk_is_billed_per_gib_month_pro_rata_and_split_by_month():
    start = at(2026, 1, 31, 23, 59, 30)
    pieces = rate_disk(start, at(2026, 3, 1, 0, 0, 0, 1), 100, Decimal("0.10"))
    assert [p.month for p in pieces] == [at(2026, 1, 1), at(2026, 2, 1), at(2026, 3, 1)]
    assert [p.seconds for p in pieces] == [30, 28 * 86400, 1]
    # 100 GiB * 0.10 = 10 per month: a whole February costs exactly 10.
    assert pieces[1].amount == Decimal("10.000000")
    assert pieces[0].amount == half_up_6(Fraction(10 * 30, 31 * 86400))
    assert pieces[2].amount == half_up_6(Fraction(10, 31 * 86400))


def test_forecast_to_month_end():
    now = at(2026, 3, 31, 23)
    assert forecast_month_end(Decimal("10"), Decimal("2"), now) == Decimal("12.000000")
    assert forecast_month_end(Decimal("0"), Decimal("1"), at(2026, 4, 16)) == Decimal("360")
    last_microsecond = at(2026, 4, 30, 23, 59, 59, 999999)
    # 3600/h is 1 per second: one microsecond left costs 0.000001
    assert forecast_month_end(Decimal("5.5"), Decimal("3600"), last_microsecond) == Decimal(
        "5.500001"
    )


def test_invoice_totals_example():
    totals = invoice_totals(
        [Decimal("10.004999"), Decimal("3.333333")],
        credit_available=Decimal("5"),
        tax_rate=Decimal("0.19"),
    )
    assert totals == InvoiceTotals(
        subtotal=Decimal("13.34"),
        credits_applied=Decimal("5.00"),
        credit_remaining=Decimal("0.00"),
        tax=Decimal("1.58"),
        total=Decimal("9.92"),
    )


def test_credits_never_exceed_the_subtotal_and_the_rest_carries_over():
    totals = invoice_totals([Decimal("12.345")], credit_available=Decimal("20"))
    assert (totals.subtotal, totals.credits_applied, totals.credit_remaining) == (
        Decimal("12.35"),
        Decimal("12.35"),
        Decimal("7.65"),
    )
    assert totals.total == Decimal("0.00")
    assert str(invoice_totals([]).total) == "0.00"
    with pytest.raises(ValueError, match="whole cents"):
        invoice_totals([Decimal(1)], credit_available=Decimal("0.001"))
    with pytest.raises(ValueError, match="negative"):
        invoice_totals([Decimal(1)], tax_rate=Decimal("-0.1"))


# --- properties --------------------------------------------------------------------------

HORIZON_START = datetime(2025, 10, 1)
HORIZON_END = datetime(2026, 5, 1)
BOUNDARIES = [at(2025, 11, 1), at(2025, 12, 1), at(2026, 1, 1), at(2026, 2, 1), at(2026, 3, 1)]

moments = st.one_of(
    st.datetimes(HORIZON_START, HORIZON_END, timezones=st.just(UTC)),
    # close to a month start, with sub-second offsets
    st.builds(
        lambda boundary, micros: boundary + timedelta(microseconds=micros),
        st.sampled_from(BOUNDARIES),
        st.integers(-150_000_000, 150_000_000),
    ),
)
prices_per_hour = st.one_of(
    st.sampled_from([Decimal("0.49"), Decimal("2.49"), Decimal("24.80"), Decimal("0.3125")]),
    st.decimals(min_value=0, max_value=100, places=4),
)
price_histories = st.lists(
    st.builds(PricePoint, moments, prices_per_hour),
    max_size=5,
    unique_by=lambda point: point.effective_from,
).flatmap(
    lambda later: st.builds(lambda first: [*later, PricePoint(LONG_AGO, first)], prices_per_hour)
)
minimums = st.sampled_from([60, 60, 0, 1, 300])
intervals = st.lists(moments, min_size=2, max_size=8, unique=True).map(
    lambda times: list(itertools.pairwise(sorted(times)))[::2]
)


def check_pieces(pieces, start, until, history):
    assert pieces[0].start == start
    assert pieces[-1].end == until
    for earlier, later in itertools.pairwise(pieces):
        assert earlier.end == later.start
        assert earlier.start < earlier.end
    for piece in pieces:
        assert piece.month == month_start(piece.start)
        assert piece.end <= next_month_start(piece.start)
        assert piece.seconds >= 0
        assert piece.amount == piece.amount.quantize(Decimal("0.000001"))
        assert piece.price_per_hour == oracle_price(history, piece.start)
        for point in history:
            if piece.start < point.effective_from < piece.end:
                assert oracle_price(history, point.effective_from) == piece.price_per_hour


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(intervals, price_histories, minimums)
def test_billed_seconds_and_amounts_survive_every_split(spans, history, minimum):
    for start, end in spans:
        pieces = rate_segment(start, end, history, minimum_seconds=minimum)
        check_pieces(pieces, start, end, history)
        billed = max(math.ceil(exact_seconds(end - start)), minimum)
        # (1) ceil to a whole second, at least the minimum, and the pieces add up to it
        assert sum(p.seconds for p in pieces) == billed
        assert pieces[0].seconds >= min(minimum, billed)
        for piece in pieces[1:]:
            assert piece.seconds <= math.ceil(exact_seconds(piece.end - piece.start))
        # (2) the amount is the sum over runs of one price, each rounded once
        runs = itertools.groupby(pieces, key=lambda p: p.price_per_hour)
        expected = Decimal(0)
        for price, run in runs:
            run = list(run)
            run_amount = half_up_6(sum(p.seconds for p in run) * Fraction(price) / 3600)
            assert sum(p.amount for p in run) == run_amount
            expected += run_amount
        assert sum(p.amount for p in pieces) == expected
        # a single price over the whole segment: splitting at months changes nothing
        flat_pieces = rate_segment(start, end, history[-1:], minimum_seconds=minimum)
        unsplit = half_up_6(billed * Fraction(history[-1].price_per_hour) / 3600)
        assert sum(p.amount for p in flat_pieces) == unsplit
        # (3) rating twice gives the identical result
        assert rate_segment(start, end, history, minimum_seconds=minimum) == pieces


@settings(max_examples=150, deadline=None)
@given(st.lists(moments, min_size=3, max_size=3, unique=True).map(sorted), price_histories)
def test_progressive_rating_of_an_open_segment_never_changes_complete_pieces(times, history):
    start, earlier_now, later_now = times
    early = rate_segment(start, None, history, now=earlier_now)
    late = rate_segment(start, None, history, now=later_now)
    check_pieces(late, start, later_now, history)
    assert all(piece.is_final for piece in early[:-1])
    assert not early[-1].is_final
    assert late[: len(early) - 1] == early[:-1]
    assert late[len(early) - 1].start == early[-1].start
    # closing the segment at later_now settles the same pieces
    closed = rate_segment(start, later_now, history)
    assert closed[:-1] == late[:-1]
    assert closed[-1] == dataclasses.replace(late[-1], is_final=True)
    assert rate_segment(start, None, history, now=later_now) == late


@settings(max_examples=100, deadline=None)
@given(
    st.lists(moments, min_size=3, max_size=3, unique=True).map(sorted),
    st.integers(0, 4096),
    st.decimals(min_value=0, max_value=1, places=4),
)
def test_disk_pieces_add_up_and_are_stable(times, gib, price):
    start, earlier_now, end = times
    pieces = rate_disk(start, end, gib, price)
    assert sum(p.seconds for p in pieces) == math.ceil(exact_seconds(end - start))
    for piece in pieces:
        assert piece.month == month_start(piece.start)
        assert piece.end <= next_month_start(piece.start)
        month_seconds = (next_month_start(piece.start) - piece.month) // timedelta(seconds=1)
        assert piece.amount == half_up_6(gib * Fraction(price) * piece.seconds / month_seconds)
    early = rate_disk(start, None, gib, price, now=earlier_now)
    assert pieces[: len(early) - 1] == early[:-1]
    assert rate_disk(start, end, gib, price) == pieces


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.decimals(min_value=0, max_value=10_000, places=6), max_size=30),
    st.decimals(min_value=0, max_value=5_000, places=2),
    st.one_of(st.none(), st.decimals(min_value=0, max_value=Decimal("0.5"), places=4)),
)
def test_invoice_totals_properties(amounts, credit, tax_rate):
    totals = invoice_totals(amounts, credit_available=credit, tax_rate=tax_rate)
    cents = Decimal("0.01")
    for value in dataclasses.astuple(totals):
        assert value == value.quantize(cents)
        assert value.as_tuple().exponent == -2
    assert totals.subtotal == half_up_cents(sum((Fraction(a) for a in amounts), Fraction(0)))
    assert 0 <= totals.credits_applied <= min(totals.subtotal, credit)
    assert totals.credits_applied == min(totals.subtotal, credit)
    assert totals.credits_applied + totals.credit_remaining == credit
    taxable = totals.subtotal - totals.credits_applied
    expected_tax = Fraction(0) if tax_rate is None else Fraction(taxable) * Fraction(tax_rate)
    assert totals.tax == half_up_cents(expected_tax)
    assert totals.total == totals.subtotal - totals.credits_applied + totals.tax
    assert totals.total >= 0


def test_the_parts_of_a_run_share_one_minimum_and_one_rounding():
    start = at(2026, 3, 10, 8)
    cut, end = start + timedelta(seconds=300.4), start + timedelta(seconds=600)
    first = rate_segment(start, cut, flat("1"))
    second = rate_segment(cut, end, flat("1"), run_before=cut - start)
    assert [p.seconds for p in (*first, *second)] == [301, 299]  # was 301 + 300
    short = rate_segment(
        cut, cut + timedelta(seconds=5), flat("1"), run_before=timedelta(seconds=13)
    )
    assert [p.seconds for p in short] == [0]  # inside the run's minimum, already billed
    with pytest.raises(ValueError, match="run_before"):
        rate_segment(start, end, flat("1"), run_before=timedelta(seconds=-1))


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(intervals, minimums, st.lists(st.floats(0, 1), max_size=4))
def test_a_run_cut_anywhere_bills_what_it_bills_whole(spans, minimum, cuts):
    """Cut a run at any moments (a resize, an adoption): its parts, each rated after the
    run's time before it, add up to the whole run's seconds."""
    for start, end in spans:
        moments = sorted(start + (end - start) * fraction for fraction in cuts)
        bounds = [start, *moments, end]
        parts = [
            rate_segment(low, high, flat("1"), minimum_seconds=minimum,
                         run_before=low - start if index else None)
            for index, (low, high) in enumerate(itertools.pairwise(bounds))
        ]  # fmt: skip
        whole = rate_segment(start, end, flat("1"), minimum_seconds=minimum)
        assert sum(p.seconds for part in parts for p in part) == sum(p.seconds for p in whole)
