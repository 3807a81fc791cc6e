"""The arithmetic of usage: per-second rating, month splits, disk, forecast, invoice totals.

Pure Python (no Django, no I/O), so the service layer, Celery jobs and tests share one
implementation. Money is ``Decimal`` everywhere; a float is refused with ``TypeError``.
Datetimes must be timezone-aware; they are converted to UTC, and a naive one raises
``NaiveDatetimeError``.

Roundings (each has one named function with an explicit mode):

- ``ceil_seconds``: a length of time rounds UP to a whole second.
- ``quantize_amount``: usage, disk and forecast amounts, half-up to 6 places.
- ``round_to_cents``: invoice subtotal and tax, half-up to cents.

How a segment is billed and split (``rate_segment``)
----------------------------------------------------
A run (from a start the tenant asked for, however often a resize, an adoption or a restart
of the platform splits it into segments) is billed ``max(ceil(length), minimum_seconds)``
seconds. The minimum is incurred at the start, so seconds accrue along the cumulative curve

    billed(r) = max(ceil(r), minimum_seconds)      for the run's time r >= 0

which jumps to the minimum as the instance starts. A segment is the part of its run from
``run_before`` (the time the run ran in its earlier segments) on, and a moment ``t`` in it
is the run's time ``r = run_before + (t - start)``. The segment is cut at every UTC month
start and every price change inside it, and piece ``i`` over ``[b_i, b_i+1)`` gets
``billed(b_i+1) - billed(b_i)`` seconds, where ``billed`` at the run's start counts as 0.
The sum telescopes to ``billed(end)``, so splitting never changes the total. The
first piece carries the minimum top-up (it gets at least ``minimum_seconds``), and a
later piece that lies wholly inside the first ``minimum_seconds`` gets 0 seconds. A piece
depends only on its own boundaries, never on where the segment will end, so a piece of an
open segment, once a later piece exists, never changes again: callers can persist
closed-month pieces and re-rate idempotently.

Amounts are cumulative within a run of one price (consecutive pieces at the same price,
split only by month starts): the run's amount after piece ``k`` is
``quantize_amount(seconds so far in the run * price / 3600)`` and each piece gets the
difference, so the pieces add up exactly to the amount of the unsplit run.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Context, Decimal
from itertools import pairwise

DEFAULT_MINIMUM_SECONDS = 60
SECONDS_PER_HOUR = 3600

AMOUNT_QUANTUM = Decimal("0.000001")
CENT = Decimal("0.01")
ZERO = Decimal(0)

_ONE_SECOND = timedelta(seconds=1)
_ONE_MICROSECOND = timedelta(microseconds=1)
_MICROSECONDS_PER_HOUR = SECONDS_PER_HOUR * 1_000_000
# Products and quotients are taken with enough digits to be exact before rounding once.
_WIDE = Context(prec=60)


class NaiveDatetimeError(ValueError):
    """A datetime without a timezone reached billing; billing only speaks UTC."""


# --- roundings ---------------------------------------------------------------------------


def ceil_seconds(length: timedelta) -> int:
    """Round a length of time UP to a whole number of seconds (exact, microsecond based)."""
    return -(-length // _ONE_SECOND)


def quantize_amount(value: Decimal) -> Decimal:
    """Round a money amount half-up to 6 decimal places (pieces, lines, forecasts)."""
    return value.quantize(AMOUNT_QUANTUM, rounding=ROUND_HALF_UP)


def round_to_cents(value: Decimal) -> Decimal:
    """Round a money amount half-up to cents (invoice subtotal and tax)."""
    return value.quantize(CENT, rounding=ROUND_HALF_UP)


# --- inputs ------------------------------------------------------------------------------


def as_utc(value: datetime, name: str = "datetime") -> datetime:
    """Return ``value`` in UTC; raise ``NaiveDatetimeError`` if it has no timezone."""
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.utcoffset() is None:
        raise NaiveDatetimeError(
            f"{name} must be timezone-aware (UTC); got naive datetime {value.isoformat()}"
        )
    return value.astimezone(UTC)


def as_decimal(value: Decimal | int, name: str) -> Decimal:
    """Return ``value`` as a finite Decimal; refuse floats (and bools) with ``TypeError``."""
    if isinstance(value, bool) or not isinstance(value, Decimal | int):
        raise TypeError(f"{name} must be a Decimal, got {type(value).__name__}")
    value = Decimal(value)
    if not value.is_finite():
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def _non_negative(value: Decimal | int, name: str) -> Decimal:
    value = as_decimal(value, name)
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    return value


# --- UTC months --------------------------------------------------------------------------


def month_start(dt: datetime) -> datetime:
    """Midnight UTC on the first day of the UTC month that contains ``dt``."""
    dt = as_utc(dt)
    return datetime(dt.year, dt.month, 1, tzinfo=UTC)


def next_month_start(dt: datetime) -> datetime:
    """Midnight UTC on the first day of the UTC month after the one that contains ``dt``."""
    start = month_start(dt)
    return datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=UTC)


def seconds_in_month(dt: datetime) -> int:
    """Length in seconds of the UTC month that contains ``dt``."""
    return (next_month_start(dt) - month_start(dt)) // _ONE_SECOND


def iter_months(start: datetime, end: datetime) -> Iterator[datetime]:
    """Month starts of every UTC month that overlaps the half-open interval [start, end)."""
    start, end = as_utc(start, "start"), as_utc(end, "end")
    if end < start:
        raise ValueError(f"end {end.isoformat()} precedes start {start.isoformat()}")
    month = month_start(start)
    while month < end:
        yield month
        month = next_month_start(month)


# --- prices ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PricePoint:
    """A spec's price per hour from ``effective_from`` until the next point."""

    effective_from: datetime
    price_per_hour: Decimal

    def __post_init__(self) -> None:
        object.__setattr__(self, "effective_from", as_utc(self.effective_from, "effective_from"))
        object.__setattr__(
            self, "price_per_hour", _non_negative(self.price_per_hour, "price_per_hour")
        )


def _history(prices: Iterable[PricePoint]) -> list[PricePoint]:
    history = sorted(prices, key=lambda point: point.effective_from)
    for earlier, later in pairwise(history):
        if earlier.effective_from == later.effective_from:
            raise ValueError(f"two prices take effect at {later.effective_from.isoformat()}")
    return history


def price_at(prices: Iterable[PricePoint], at: datetime) -> Decimal:
    """The price per hour in effect at ``at`` (the latest point not after it)."""
    at = as_utc(at, "at")
    in_effect = [point for point in _history(prices) if point.effective_from <= at]
    if not in_effect:
        raise ValueError(f"no price in effect at {at.isoformat()}")
    return in_effect[-1].price_per_hour


def _price_runs(
    prices: Iterable[PricePoint], start: datetime, end: datetime
) -> list[tuple[datetime, Decimal]]:
    """(from, price) for each run of one price over [start, end); equal neighbours merge."""
    history = _history(prices)
    runs = [(start, price_at(history, start))]
    for point in history:
        if start < point.effective_from < end and point.price_per_hour != runs[-1][1]:
            runs.append((point.effective_from, point.price_per_hour))
    return runs


# --- rating ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RatedPiece:
    """Part of a running segment inside one UTC month at one price.

    ``is_final`` is False only for the last piece of a segment rated while still open (or
    rated as of a ``now`` before its end): that piece grows; every other piece is settled.
    """

    start: datetime
    end: datetime
    month: datetime
    price_per_hour: Decimal
    seconds: int
    amount: Decimal
    is_final: bool


@dataclass(frozen=True)
class DiskPiece:
    """Part of a disk's time while its instance does not run, inside one UTC month (see
    ``RatedPiece``)."""

    start: datetime
    end: datetime
    month: datetime
    seconds: int
    amount: Decimal
    is_final: bool


def _window(
    start: datetime, end: datetime | None, now: datetime | None
) -> tuple[datetime, datetime, bool]:
    """(start, rated-until, whether the rated-until is the segment's real end)."""
    start = as_utc(start, "start")
    if end is None and now is None:
        raise ValueError("an open segment (end=None) is rated up to a given now")
    if end is not None:
        end = as_utc(end, "end")
        if end < start:
            raise ValueError(f"end {end.isoformat()} precedes start {start.isoformat()}")
    if now is not None:
        now = as_utc(now, "now")
        if now < start:
            raise ValueError(f"now {now.isoformat()} precedes start {start.isoformat()}")
    until = min(moment for moment in (end, now) if moment is not None)
    return start, until, until == end


def _spans(
    start: datetime, until: datetime, cuts: Iterable[datetime]
) -> list[tuple[datetime, datetime]]:
    """[start, until) cut at every month start and every given cut strictly inside it."""
    inside = {cut for cut in (*iter_months(start, until), *cuts) if start < cut < until}
    return list(pairwise([start, *sorted(inside), until]))


def _hourly_amount(seconds: int, price_per_hour: Decimal) -> Decimal:
    return quantize_amount(
        _WIDE.divide(_WIDE.multiply(Decimal(seconds), price_per_hour), Decimal(SECONDS_PER_HOUR))
    )


def rate_segment(
    start: datetime,
    end: datetime | None,
    prices: Sequence[PricePoint],
    *,
    now: datetime | None = None,
    minimum_seconds: int = DEFAULT_MINIMUM_SECONDS,
    run_before: timedelta | None = None,
) -> tuple[RatedPiece, ...]:
    """Rate one running segment, split at UTC month starts and price changes, as the part of
    its run after ``run_before`` of the run's time (None: the run's first segment).

    ``end=None`` is an open segment, rated up to ``now``; a closed one is rated up to
    ``min(end, now)``. The module docstring describes the split and rounding scheme.
    """
    if isinstance(minimum_seconds, bool) or not isinstance(minimum_seconds, int):
        raise TypeError("minimum_seconds must be an int")
    if minimum_seconds < 0:
        raise ValueError(f"minimum_seconds must not be negative, got {minimum_seconds}")
    if run_before is not None and run_before < timedelta(0):
        raise ValueError(f"run_before must not be negative, got {run_before}")
    start, until, closed = _window(start, end, now)
    runs = _price_runs(prices, start, until)
    spans = _spans(start, until, (run_from for run_from, _ in runs[1:]))
    ran_before = run_before or timedelta(0)

    def billed_at(moment: datetime) -> int:
        return max(ceil_seconds(ran_before + (moment - start)), minimum_seconds)

    pieces = []
    billed_before = 0 if run_before is None else billed_at(start)
    run_index, run_seconds, run_amount = 0, 0, ZERO
    for index, (piece_start, piece_end) in enumerate(spans):
        if run_index + 1 < len(runs) and runs[run_index + 1][0] <= piece_start:
            run_index, run_seconds, run_amount = run_index + 1, 0, ZERO
        price = runs[run_index][1]
        billed = billed_at(piece_end)
        seconds, billed_before = billed - billed_before, billed
        run_seconds += seconds
        run_total = _hourly_amount(run_seconds, price)
        amount, run_amount = run_total - run_amount, run_total
        pieces.append(
            RatedPiece(
                start=piece_start,
                end=piece_end,
                month=month_start(piece_start),
                price_per_hour=price,
                seconds=seconds,
                amount=amount,
                is_final=closed or index < len(spans) - 1,
            )
        )
    return tuple(pieces)


def rate_disk(
    start: datetime,
    end: datetime | None,
    gib: Decimal | int,
    price_per_gib_month: Decimal,
    *,
    now: datetime | None = None,
) -> tuple[DiskPiece, ...]:
    """Rate a disk while its instance does not run, per GiB-month pro rata per second, no minimum.

    Split at UTC month starts; piece seconds follow the same cumulative round-up as
    ``rate_segment`` (without the minimum), and a piece costs
    ``gib * price_per_gib_month * seconds / seconds_in_month``, half-up to 6 places.
    """
    gib = _non_negative(gib, "gib")
    price = _non_negative(price_per_gib_month, "price_per_gib_month")
    start, until, closed = _window(start, end, now)
    spans = _spans(start, until, ())
    pieces = []
    for index, (piece_start, piece_end) in enumerate(spans):
        seconds = ceil_seconds(piece_end - start) - ceil_seconds(piece_start - start)
        cost = _WIDE.multiply(_WIDE.multiply(gib, price), Decimal(seconds))
        pieces.append(
            DiskPiece(
                start=piece_start,
                end=piece_end,
                month=month_start(piece_start),
                seconds=seconds,
                amount=quantize_amount(_WIDE.divide(cost, Decimal(seconds_in_month(piece_start)))),
                is_final=closed or index < len(spans) - 1,
            )
        )
    return tuple(pieces)


# --- forecast and invoice totals ---------------------------------------------------------


def forecast_month_end(month_to_date: Decimal, rate_per_hour: Decimal, now: datetime) -> Decimal:
    """Projected amount at the end of the UTC month of ``now``: month-to-date plus the
    current cost rate for the time left (microsecond exact), half-up to 6 places."""
    month_to_date = as_decimal(month_to_date, "month_to_date")
    rate_per_hour = _non_negative(rate_per_hour, "rate_per_hour")
    now = as_utc(now, "now")
    remaining = (next_month_start(now) - now) // _ONE_MICROSECOND
    projected = _WIDE.divide(
        _WIDE.multiply(rate_per_hour, Decimal(remaining)), Decimal(_MICROSECONDS_PER_HOUR)
    )
    return quantize_amount(month_to_date + projected)


@dataclass(frozen=True)
class InvoiceTotals:
    """Totals in cents; ``credit_remaining`` is the credit that carries over."""

    subtotal: Decimal
    credits_applied: Decimal
    credit_remaining: Decimal
    tax: Decimal
    total: Decimal


def invoice_totals(
    line_amounts: Iterable[Decimal],
    *,
    credit_available: Decimal = ZERO,
    tax_rate: Decimal | None = None,
) -> InvoiceTotals:
    """Subtotal = the lines' sum rounded to cents; credits cover at most the subtotal;
    tax = ``round_to_cents((subtotal - credits) * tax_rate)``; total = the rest plus tax.

    ``credit_available`` must be a whole number of cents; ``tax_rate`` is a fraction
    (``Decimal("0.19")`` for 19 %), or None for no tax.
    """
    amounts = [as_decimal(amount, "line amount") for amount in line_amounts]
    credit = _non_negative(credit_available, "credit_available")
    if round_to_cents(credit) != credit:
        raise ValueError(f"credit_available must be whole cents, got {credit}")
    credit = round_to_cents(credit)
    subtotal = round_to_cents(sum(amounts, ZERO))
    credits_applied = min(credit, max(subtotal, round_to_cents(ZERO)))
    taxable = subtotal - credits_applied
    if tax_rate is None:
        tax = round_to_cents(ZERO)
    else:
        tax = round_to_cents(taxable * _non_negative(tax_rate, "tax_rate"))
    return InvoiceTotals(
        subtotal=subtotal,
        credits_applied=credits_applied,
        credit_remaining=credit - credits_applied,
        tax=tax,
        total=taxable + tax,
    )


def _negated(amount: Decimal) -> Decimal:
    return -amount + 0  # + 0: a reversed zero is 0.00, not -0.00


def reversed_totals(totals: InvoiceTotals) -> InvoiceTotals:
    """A credit note's totals: each of the invoice's, negated (credits applied come back as
    negative credits), so the note reverses the invoice to the cent. Re-rounding the negated
    lines would not: half-up moves away from zero, and a sum that crosses zero (lines
    against the returned credits) rounds the other way."""
    return InvoiceTotals(
        subtotal=_negated(totals.subtotal),
        credits_applied=_negated(totals.credits_applied),
        credit_remaining=ZERO,
        tax=_negated(totals.tax),
        total=_negated(totals.total),
    )
