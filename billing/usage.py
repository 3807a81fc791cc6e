"""What a tenant's usage costs: invoice lines, the month's report for the usage page and the
API (lines, per instance, per spec, per day, current rate, forecast). Read only.

Lines group usage by (kind, instance, spec, unit price, disk size), both here (rated live
from the segments) and in finalization (summed from the stored pieces), through the same
``make_line``, so a month's report and its invoice show the same lines. Volumes and snapshots
have a line each (kinds ``volume`` and ``snapshot``), rated from their rows in both
(storage.py).

A month whose invoice is issued is history: its report is the invoice's stored lines, and
its days spread the stored pieces that invoice was made from, never a live rating (a
correction that arrives after issue changes neither).
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import Q, Sum
from django.utils import timezone

from accounts.models import Tenant
from billing import storage
from billing.metering import price_history, rate, unit_price
from billing.models import (
    Invoice,
    UsageCorrection,
    UsageKind,
    UsagePiece,
    UsageSegment,
    decimal_to_micros,
    micros_to_decimal,
    month_bounds,
)
from billing.rating import (
    ZERO,
    forecast_month_end,
    month_start,
    next_month_start,
    price_at,
    quantize_amount,
    seconds_in_month,
)
from console import integers
from console.catalog.models import Spec
from console.instances.models import Instance

_SECONDS_PER_HOUR = Decimal(3600)
STORED = (UsageKind.VOLUME, UsageKind.SNAPSHOT)  # lines rated from their rows (storage.py)


@dataclass(frozen=True, order=True)
class LineKey:
    kind: str
    instance_id: int
    spec_id: int
    unit_price: Decimal
    disk_gib: int | Decimal  # a snapshot's line: the GiB it stores
    corrects: str = ""  # a correction's line: the issued invoice it corrects (its number)
    volume_id: int = 0  # a volume's line: the volume
    snapshot_id: int = 0  # a snapshot's line: the snapshot (its GiB stored in disk_gib); 0:
    # the tenant's repository's (the GiB it held)
    corrects_month: date | None = None  # a correction's line: the month it corrects


@dataclass(frozen=True)
class UsageLine:
    """One line of usage: an instance's GPU time at one price, or its disk while not running."""

    kind: str
    instance_id: int
    instance_name: str
    spec_code: str
    spec_name: str
    description: str
    seconds: int
    unit_price: Decimal  # per hour (GPU), per GiB-month (storage)
    unit_price_per_hour: Decimal | None  # GPU time only
    disk_gib: int | Decimal
    amount: Decimal
    volume_id: int = 0  # a volume's line (kind volume): the volume, named in instance_name
    snapshot_id: int = 0  # a snapshot's line: the snapshot, its source named in instance_name
    # storage: amount = disk_gib × seconds / month_seconds × unit_price, rounded once
    month_seconds: int | None = None

    @property
    def is_storage(self) -> bool:
        return self.month_seconds is not None

    @property
    def unit_price_per_gib_month(self) -> Decimal | None:
        return self.unit_price if self.is_storage else None

    @property
    def gib(self) -> Decimal | None:
        return Decimal(self.disk_gib) if self.is_storage else None

    @property
    def sort_key(self) -> tuple:
        return (
            self.kind != UsageKind.GPU,
            self.instance_name,
            self.instance_id,
            self.spec_code,
            self.unit_price,
        )


def disk_hourly(gib: int | Decimal, price_per_gib_month: Decimal, month: date) -> Decimal:
    """A disk's cost per hour in a month (its length varies), to 6 places."""
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    return quantize_amount(
        Decimal(gib) * price_per_gib_month * _SECONDS_PER_HOUR / seconds_in_month(start)
    )


def describe(key: LineKey, spec_name: str, instance_name: str) -> str:
    if key.kind == UsageKind.GPU:
        what = f"GPU time: {spec_name}"
    elif key.kind == UsageKind.VOLUME:
        price = f"{key.unit_price.normalize():f}"
        return f"Volume {instance_name}: {key.disk_gib} GiB at {price} per GiB-month"
    elif key.kind == UsageKind.SNAPSHOT and not key.snapshot_id:
        price = f"{key.unit_price.normalize():f}"
        return f"Snapshot store: {key.disk_gib:.3f} GiB held at {price} per GiB-month"
    elif key.kind == UsageKind.SNAPSHOT:
        price = f"{key.unit_price.normalize():f}"
        return (
            f"Snapshot {key.snapshot_id} of {instance_name}: {key.disk_gib:.3f} GiB stored at "
            f"{price} per GiB-month"
        )
    else:
        price = f"{key.unit_price.normalize():f}"
        what = f"Disk while not running: {key.disk_gib} GiB at {price} per GiB-month"
    if key.corrects:
        return f"Correction to {key.corrects}, {instance_name}: {what}"
    return what


def make_line(
    key: LineKey,
    *,
    month: date,
    instance_name: str,
    spec_code: str,
    spec_name: str,
    seconds: int,
    amount_micros: int,
) -> UsageLine:
    hourly, month_seconds = key.unit_price, None
    if key.kind != UsageKind.GPU:  # rated in its own month (a correction: the one it corrects)
        rated_in = key.corrects_month or month
        hourly = None
        month_seconds = seconds_in_month(datetime(rated_in.year, rated_in.month, 1, tzinfo=UTC))
    return UsageLine(
        kind=key.kind,
        instance_id=key.instance_id,
        instance_name=instance_name,
        spec_code=spec_code,
        spec_name=spec_name,
        description=describe(key, spec_name, instance_name),
        seconds=seconds,
        unit_price=key.unit_price,
        unit_price_per_hour=hourly,
        disk_gib=key.disk_gib,
        amount=micros_to_decimal(amount_micros),
        volume_id=key.volume_id,
        snapshot_id=key.snapshot_id,
        month_seconds=month_seconds,
    )


@dataclass(frozen=True)
class Breakdown:
    key: str
    label: str
    seconds: int
    amount: Decimal


@dataclass(frozen=True)
class Day:
    date: date
    amount: Decimal


@dataclass(frozen=True)
class Accruing:
    """Something that costs money right now."""

    kind: str
    instance_id: int
    instance_name: str
    spec_code: str
    since: datetime
    per_hour: Decimal


@dataclass
class UsageReport:
    tenant: Tenant
    month: date
    now: datetime
    lines: list[UsageLine]
    daily: list[Day]
    accruing: list[Accruing] = field(default_factory=list)

    @property
    def period_start(self) -> datetime:
        return datetime(self.month.year, self.month.month, 1, tzinfo=UTC)

    @property
    def period_end(self) -> datetime:
        return next_month_start(self.period_start)

    @property
    def is_current(self) -> bool:
        return self.period_start <= self.now < self.period_end

    @property
    def total(self) -> Decimal:
        return quantize_amount(sum((line.amount for line in self.lines), ZERO))

    @property
    def rate_per_hour(self) -> Decimal:
        return quantize_amount(sum((item.per_hour for item in self.accruing), ZERO))

    @property
    def forecast(self) -> Decimal | None:
        """Month-to-date plus the current rate until the month ends (current month only)."""
        if not self.is_current:
            return None
        return forecast_month_end(self.total, self.rate_per_hour, self.now)

    @property
    def by_instance(self) -> list[Breakdown]:
        return _breakdown(
            self._of_instances, lambda line: (str(line.instance_id), line.instance_name)
        )

    @property
    def by_spec(self) -> list[Breakdown]:
        return _breakdown(self._of_instances, lambda line: (line.spec_code, line.spec_name))

    @property
    def by_volume(self) -> list[Breakdown]:
        volumes = [line for line in self.lines if line.kind == UsageKind.VOLUME]
        return _breakdown(volumes, lambda line: (str(line.volume_id), line.instance_name))

    @property
    def by_snapshot(self) -> list[Breakdown]:
        snapshots = [line for line in self.lines if line.kind == UsageKind.SNAPSHOT]
        return _breakdown(
            snapshots,
            lambda line: (
                str(line.snapshot_id),
                f"{line.snapshot_id} of {line.instance_name}"
                if line.snapshot_id
                else line.instance_name,
            ),
        )

    @property
    def _of_instances(self) -> list[UsageLine]:
        return [line for line in self.lines if line.kind not in STORED]


def _breakdown(lines: Iterable[UsageLine], key) -> list[Breakdown]:
    seconds: dict[tuple[str, str], int] = defaultdict(int)
    amounts: dict[tuple[str, str], Decimal] = defaultdict(lambda: ZERO)
    for line in lines:
        k = key(line)
        seconds[k] += line.seconds if line.kind == UsageKind.GPU else 0
        amounts[k] += line.amount
    rows = [Breakdown(k[0], k[1], seconds[k], amounts[k]) for k in amounts]
    return sorted(rows, key=lambda row: (-row.amount, row.label))


# What parse_month reads, as the API schema says it: an ECMAScript pattern, where `$` is the end.
MONTH_PATTERN = "^[0-9]{4}-[0-9]{2}$"


def parse_month(text: str) -> date:
    """``YYYY-MM`` → the month's first day; ValueError (its message in words) when it is not
    a month."""
    year, dash, month = text.partition("-") if isinstance(text, str) else ("", "", "")
    try:
        if not dash or len(year) != 4 or len(month) != 2:
            raise integers.NotAWholeNumber()
        year, month = integers.parse(year), integers.parse(month)
    except integers.NotAWholeNumber:
        raise ValueError("Use the form YYYY-MM, e.g. 2026-05.") from None
    if not 2000 <= year <= 9998 or not 1 <= month <= 12:
        raise ValueError("Give a month between 2000-01 and 9998-12.")
    return date(year, month, 1)


def current_month(now: datetime | None = None) -> date:
    return month_start(now or timezone.now()).date()


def segments_in(tenant_ids, start: datetime, end: datetime):
    """Segments that may have usage in [start, end)."""
    return (
        UsageSegment.objects.filter(tenant_id__in=tenant_ids, started_at__lt=end)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gte=start))
        .order_by("pk")
    )


def _midnights(after: datetime, before: datetime) -> list[datetime]:
    day = datetime(after.year, after.month, after.day, tzinfo=UTC) + timedelta(days=1)
    result = []
    while day < before:
        result.append(day)
        day += timedelta(days=1)
    return result


@dataclass
class _Rated:
    """One tenant's usage in a month as of a moment: seconds and micros per line, and the
    segments that accrue at that moment with their cost per hour."""

    seconds: dict[LineKey, int] = field(default_factory=lambda: defaultdict(int))
    micros: dict[LineKey, int] = field(default_factory=lambda: defaultdict(int))
    accruing: list[tuple[UsageSegment, Decimal]] = field(default_factory=list)
    stored: dict[LineKey, storage.StoredPiece] = field(default_factory=dict)
    accruing_stored: list[tuple[storage.StoredPiece, Decimal]] = field(default_factory=list)

    @property
    def total_micros(self) -> int:
        return sum(self.micros.values())


def _rate_month(tenant_ids, month: date, now: datetime, on_segment=None) -> dict[int, _Rated]:
    """Every given tenant's usage in ``month`` as of ``now``, rated live from the segments
    (what the stored pieces will hold once the meter catches up), in two queries.
    ``on_segment(segment, prices)`` sees each segment that started by ``now``."""
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    end = next_month_start(start)
    segments = list(segments_in(tenant_ids, start, min(end, now + timedelta(microseconds=1))))
    prices = price_history({segment.spec_id for segment in segments})
    rated: dict[int, _Rated] = defaultdict(_Rated)
    for segment in segments:
        if segment.started_at > now:
            continue
        tenant = rated[segment.tenant_id]
        for piece in rate(segment, prices, now):
            if piece.month != start:
                continue
            key = LineKey(
                segment.kind,
                segment.instance_id,
                segment.spec_id,
                unit_price(segment, piece),
                segment.disk_gib,
            )
            tenant.seconds[key] += piece.seconds
            tenant.micros[key] += decimal_to_micros(piece.amount)
        if on_segment is not None:
            on_segment(segment, prices)
        if segment.ended_at is None and start <= now < end:
            tenant.accruing.append((segment, _per_hour(segment, prices, now)))
    for item in storage.month_pieces(tenant_ids, month, now):
        piece = item.piece
        tenant = rated[item.tenant_id]
        key = stored_key(item)
        tenant.seconds[key] += piece.seconds
        tenant.micros[key] += decimal_to_micros(piece.amount)
        tenant.stored[key] = item
        if not piece.is_final and start <= now < end:
            per_hour = disk_hourly(item.gib, item.price_per_gib_month, month)
            tenant.accruing_stored.append((item, per_hour))
    for row in month_corrections(tenant_ids, month, now):
        tenant = rated[row["tenant_id"]]
        key = correction_key(row)
        tenant.seconds[key] += row["total_seconds"]
        tenant.micros[key] += row["micros"]
    return rated


def stored_key(item: storage.StoredPiece) -> LineKey:
    """A volume's line (its size in GiB) or a snapshot's (the GiB it stores)."""
    if item.kind == UsageKind.VOLUME:
        return LineKey(item.kind, 0, 0, item.price_per_gib_month, int(item.gib), volume_id=item.pk)
    return LineKey(item.kind, 0, 0, item.price_per_gib_month, item.gib, snapshot_id=item.pk)


def stored_lines(tenant_ids, month: date, now: datetime) -> dict[int, list[UsageLine]]:
    """Each tenant's volume and snapshot lines of ``month`` as of ``now`` (finalization's,
    after it)."""
    seconds: dict[tuple[int, LineKey], int] = defaultdict(int)
    micros: dict[tuple[int, LineKey], int] = defaultdict(int)
    names: dict[LineKey, str] = {}
    for item in storage.month_pieces(tenant_ids, month, now):
        key = (item.tenant_id, stored_key(item))
        seconds[key] += item.piece.seconds
        micros[key] += decimal_to_micros(item.piece.amount)
        names[key[1]] = item.name
    lines: dict[int, list[UsageLine]] = defaultdict(list)
    for (tenant_id, key), total in seconds.items():
        line = make_line(
            key,
            month=month,
            instance_name=names[key],
            spec_code="",
            spec_name="",
            seconds=total,
            amount_micros=micros[(tenant_id, key)],
        )
        lines[tenant_id].append(line)
    return lines


# What makes one line of a month's usage: pieces and corrections are grouped by it
LINE_GROUP = (
    "tenant_id",
    "kind",
    "instance_id",
    "instance__name",
    "spec_id",
    "spec__code",
    "spec__name",
    "unit_price",
    "disk_gib",
)
CORRECTION_GROUP = (*LINE_GROUP, "corrects__number", "corrects__month")


def corrections_of(tenant_ids, month: date, now: datetime | None = None, *, credited=False):
    """The corrections found in ``month`` (made by ``now``; ``UsageCorrection``): those billed
    on the month's invoice, or (``credited``) those a credit note takes back at its
    finalization. The corrections of one issued invoice found in one month go together:
    a credit note when they take money back (their sum is below zero), else lines."""
    rows = UsageCorrection.objects.filter(tenant_id__in=tenant_ids, month=month)
    if now is not None:
        rows = rows.filter(created_at__lte=now)
    taking_back = list(
        rows.values("corrects_id")
        .annotate(net=Sum("amount_micros"))
        .filter(net__lt=0)
        .values_list("corrects_id", flat=True)
    )
    if credited:
        return rows.filter(corrects_id__in=taking_back)
    return rows.exclude(corrects_id__in=taking_back)


def grouped_corrections(rows, *also: str):
    """Corrections grouped by line (and by ``also``), with their ``total_seconds`` and
    ``micros``."""
    return (
        rows.values(*CORRECTION_GROUP, *also)
        .annotate(total_seconds=Sum("seconds"), micros=Sum("amount_micros"))
        .order_by()
    )


def month_corrections(tenant_ids, month: date, now: datetime | None = None):
    """The corrections billed on ``month``'s invoice (made by ``now``), grouped by line: what
    it adds for issued invoices that turned out to bill too little."""
    return grouped_corrections(corrections_of(tenant_ids, month, now))


def correction_key(row: dict) -> LineKey:
    return LineKey(
        row["kind"],
        row["instance_id"],
        row["spec_id"],
        row["unit_price"],
        row["disk_gib"],
        row["corrects__number"] or f"{row['corrects__month']:%B %Y} (nothing to pay)",
        corrects_month=row["corrects__month"],
    )


@dataclass(frozen=True)
class SoFar:
    """What a tenant's usage in a month has cost as of a moment ("so far"): the one figure
    that the usage page, a draft invoice (page, list, admin, API, exports) and the budget
    show, all from ``so_far``. ``amount`` is at 6 places, as billed."""

    month: date
    as_of: datetime
    amount: Decimal


def so_far(tenant_ids, month: date, now: datetime | None = None) -> dict[int, SoFar]:
    """Each given tenant's ``SoFar`` in ``month`` as of ``now`` (tenants without usage
    included, at zero), rated live from its segments in two queries whatever the number of
    tenants: the meter's stored pieces lag by up to a minute, so they never serve here."""
    now = now or timezone.now()
    tenant_ids = list(tenant_ids)
    rated = _rate_month(tenant_ids, month, now)
    return {
        tenant_id: SoFar(
            month,
            now,
            micros_to_decimal(rated[tenant_id].total_micros if tenant_id in rated else 0),
        )
        for tenant_id in tenant_ids
    }


def usage_report(tenant: Tenant, month: date, now: datetime | None = None) -> UsageReport:
    """The tenant's usage in ``month`` as of ``now``: as issued when the month's invoice is
    issued (``issued_report``), else rated live from its segments (its ``total`` is
    ``so_far``'s amount at the same moment)."""
    now = now or timezone.now()
    invoice = (
        Invoice.objects.filter(tenant=tenant, kind=Invoice.Kind.INVOICE, month=month)
        .exclude(status=Invoice.Status.DRAFT)
        .select_related("tenant")
        .first()
    )
    if invoice is not None:
        return issued_report(invoice, now)
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    end = next_month_start(start)
    daily: dict[date, Decimal] = defaultdict(lambda: ZERO)
    rated = _rate_month(
        [tenant.pk],
        month,
        now,
        on_segment=lambda segment, prices: _add_daily(daily, segment, prices, start, end, now),
    ).get(tenant.pk, _Rated())
    for day, amount in correction_days(tenant.pk, month, now):
        daily[day] += micros_to_decimal(amount)
    stored_days: dict[date, int] = defaultdict(int)
    for item in storage.month_pieces([tenant.pk], month, now):
        piece = item.piece
        _spread(stored_days, piece.start, piece.end, decimal_to_micros(piece.amount))
    for day, amount in stored_days.items():
        daily[day] += micros_to_decimal(amount)
    seconds, micros, accruing = rated.seconds, rated.micros, rated.accruing
    instance_ids = {key.instance_id for key in seconds} | {s.instance_id for s, _ in accruing}
    names = dict(Instance.objects.filter(pk__in=instance_ids).values_list("pk", "name"))
    specs = {
        spec.pk: spec
        for spec in Spec.objects.filter(
            pk__in={key.spec_id for key in seconds} | {s.spec_id for s, _ in accruing}
        )
    }
    lines = [
        make_line(
            key,
            month=month,
            instance_name=names.get(key.instance_id, ""),
            spec_code=specs[key.spec_id].code,
            spec_name=specs[key.spec_id].name,
            seconds=seconds[key],
            amount_micros=micros[key],
        )
        for key in seconds
        if key.kind not in STORED
    ]
    lines += [
        make_line(
            key,
            month=month,
            instance_name=rated.stored[key].name,
            spec_code="",
            spec_name="",
            seconds=seconds[key],
            amount_micros=micros[key],
        )
        for key in seconds
        if key.kind in STORED
    ]
    lines.sort(key=lambda line: line.sort_key)
    days = []
    day = start
    while day < end and day <= now:
        days.append(Day(day.date(), daily.get(day.date(), ZERO)))
        day += timedelta(days=1)
    return UsageReport(
        tenant=tenant,
        month=month,
        now=now,
        lines=lines,
        daily=days,
        accruing=[
            Accruing(
                kind=segment.kind,
                instance_id=segment.instance_id,
                instance_name=names.get(segment.instance_id, ""),
                spec_code=specs[segment.spec_id].code,
                since=segment.started_at,
                per_hour=per_hour,
            )
            for segment, per_hour in accruing
        ]
        + [
            Accruing(
                kind=item.kind,
                instance_id=0,
                instance_name=item.name,
                spec_code="",
                since=item.since,
                per_hour=per_hour,
            )
            for item, per_hour in rated.accruing_stored
        ],
    )


def issued_report(invoice: Invoice, now: datetime) -> UsageReport:
    """The report of a month whose invoice is issued (finalized, paid or void): the
    invoice's lines as stored, and per day the stored pieces it was made from. Nothing
    accrues in it."""
    rows = list(invoice.lines.order_by("position"))
    names = dict(
        Spec.objects.filter(code__in={row.spec_code for row in rows}).values_list("code", "name")
    )
    lines = [
        UsageLine(
            kind=row.kind,
            instance_id=row.instance_id or 0,
            instance_name=row.instance_name,
            spec_code=row.spec_code,
            spec_name=names.get(row.spec_code, row.spec_code),
            description=row.description,
            seconds=row.seconds,
            unit_price=row.unit_price_per_hour
            if row.month_seconds is None
            else row.unit_price_per_gib_month,
            unit_price_per_hour=row.unit_price_per_hour,
            disk_gib=row.gib or 0,
            amount=row.amount,
            month_seconds=row.month_seconds,
        )
        for row in rows
    ]
    start, end = month_bounds(invoice.month)
    pieces = UsagePiece.objects.filter(tenant_id=invoice.tenant_id, month=invoice.month)
    daily: dict[date, int] = defaultdict(int)
    for piece_start, piece_end, micros in pieces.values_list("start", "end", "amount_micros"):
        _spread(daily, piece_start, piece_end, micros)
    for item in storage.month_pieces([invoice.tenant_id], invoice.month, invoice.issued_at or now):
        piece = item.piece
        _spread(daily, piece.start, piece.end, decimal_to_micros(piece.amount))
    for day, micros in correction_days(invoice.tenant_id, invoice.month, now):
        daily[day] += micros
    days = []
    day = start
    while day < end:
        days.append(Day(day.date(), micros_to_decimal(daily.get(day.date(), 0))))
        day += timedelta(days=1)
    return UsageReport(tenant=invoice.tenant, month=invoice.month, now=now, lines=lines, daily=days)


def correction_days(tenant_id: int, month: date, now: datetime) -> list[tuple[date, int]]:
    """The corrections billed on ``month``'s invoice by ``now``: the day each was made, its
    amount (millionths)."""
    return [
        (made.date(), micros)
        for made, micros in corrections_of([tenant_id], month, now).values_list(
            "created_at", "amount_micros"
        )
    ]


def _spread(daily: dict[date, int], start: datetime, end: datetime, micros: int) -> None:
    """Add a stored piece's amount (millionths) to the days it covers, in proportion to its
    time in each (all on its first day when it has no length), exactly."""
    length = (end - start) // timedelta(microseconds=1)
    before, spread = start, 0
    for moment in [*_midnights(start, end), end]:
        elapsed = (moment - start) // timedelta(microseconds=1)
        cumulative = micros * elapsed // length if length else micros
        daily[before.date()] += cumulative - spread
        before, spread = moment, cumulative


def _month_amount(segment, prices, month: datetime, at: datetime) -> Decimal:
    return sum((p.amount for p in rate(segment, prices, at) if p.month == month), ZERO)


def _add_daily(daily, segment, prices, start: datetime, end: datetime, now: datetime) -> None:
    """Spread the segment's amount in the month over the days it accrued, exactly: the
    amount billed as of each midnight, minus the amount as of the one before."""
    low = max(segment.started_at, start)
    high = min(end, now, segment.ended_at or now)
    if high < low:
        return
    before, cumulative = low, ZERO
    for moment in [*_midnights(low, high), high]:
        amount = _month_amount(segment, prices, start, moment)
        daily[before.date()] += amount - cumulative
        before, cumulative = moment, amount


def _per_hour(segment: UsageSegment, prices, now: datetime) -> Decimal:
    if segment.kind == UsageKind.GPU:
        return price_at(prices[segment.spec_id], now)
    return disk_hourly(
        segment.disk_gib, segment.disk_price_per_gib_month or ZERO, month_start(now).date()
    )


def disk_cost_per_month(gib: int) -> Decimal:
    """What a disk of ``gib`` GiB costs per month while its instance is stopped."""
    return quantize_amount(Decimal(gib) * Decimal(settings.BILLING_DISK_PRICE_PER_GIB_MONTH))
