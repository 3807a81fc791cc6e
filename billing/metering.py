"""Usage segments and the meter.

A GPU segment opens when an instance enters ``running`` and closes when it leaves it; a
disk segment does the same for every other state in which its disk exists
(``KIND_STATES``): from the first placement until terminate, one of the two is open. The
receiver of ``instance_state_changed`` calls ``record_transition``; because that signal is
sent after commit, a crash between the commit and the receiver would lose a segment, so the
meter also repairs segments from the instances' event history (``reconcile``). Both sides
are idempotent: a segment is unique by ``(instance, kind, started_at)``, and closing an
already closed segment does nothing.

The meter then rates every segment that is open or closed but not yet rated
(``rate_pending``) into ``UsagePiece`` rows, one per UTC month and price, upserted by
``(segment, start)``: rating again gives the same rows. Pieces in a month whose invoice is
no longer a draft are never written again (an issued invoice is immutable): a change there
(a late failover that moves a stop back, a repair) is billed as a ``UsageCorrection`` in the
month open when the meter finds it, once.

A price point added since the meter's last run marks every GPU segment of its spec with time
at or after its effective moment unrated (``mark_repriced``), so the stored pieces are rated
with the price history as it is now, the one ``rate`` that the usage page, the API, the
draft and the budget use live: a point back-dated into the open month re-rates all of that
month's usage of the spec from its effective moment on, whatever was rated before.
"""

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, Max, Min, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from billing import locks
from billing.bulk import upsert_rows
from billing.models import (
    Invoice,
    MeterCursor,
    UsageCorrection,
    UsageKind,
    UsagePiece,
    UsageSegment,
    decimal_to_micros,
)
from billing.rating import (
    DiskPiece,
    PricePoint,
    RatedPiece,
    as_utc,
    month_start,
    rate_disk,
    rate_segment,
)
from console.catalog.models import Spec, SpecPrice
from console.instances.models import Instance, InstanceEvent, State
from console.instances.runs import RUN_OPENERS, opens_run

log = logging.getLogger(__name__)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The states a segment kind bills for. The GPU while it runs: the spec's price per hour
# covers its disk then. The disk in every other state in which it exists, from the first
# placement (where it is made) until terminate deletes it: provisioning, starting (an image
# pull can take an hour), rebooting, unreachable, stopping, stopped, failed and queued again.
# So the two kinds tile an instance's life from placement to terminate: one bills at a time.
KIND_STATES = {
    UsageKind.GPU: frozenset({State.RUNNING}),
    UsageKind.DISK: frozenset(
        {
            State.PROVISIONING,
            State.STARTING,
            State.REBOOTING,
            State.UNREACHABLE,
            State.STOPPING,
            State.STOPPED,
            State.FAILED,
            State.PENDING,
        }
    ),
}
# Entering these places an instance on a host, where its disk is made: only an instance that
# was placed has a disk to bill (one stopped while still queued has none).
PLACED_STATES = (State.PROVISIONING, State.STARTING)
# Instances with a transition this recent are checked against their segments on every run.
REPAIR_WINDOW = timedelta(hours=1)
CHUNK_SIZE = 2000
PIECE_FIELDS = (
    "tenant",
    "instance",
    "spec",
    "kind",
    "disk_gib",
    "month",
    "end",
    "unit_price",
    "seconds",
    "amount_micros",
    "is_final",
)
PIECE_ATTRS = tuple(
    f"{name}_id" if name in ("tenant", "instance", "spec") else name for name in PIECE_FIELDS
)


def minimum_seconds() -> int:
    return settings.BILLING_MINIMUM_SECONDS


def disk_price_per_gib_month() -> Decimal:
    return Decimal(settings.BILLING_DISK_PRICE_PER_GIB_MONTH)


# --- prices ------------------------------------------------------------------------------


def price_history(spec_ids: Iterable[int]) -> dict[int, tuple[PricePoint, ...]]:
    """Each spec's price history (``SpecPrice``: every spec has a point from its creation),
    as rating wants it. The first point also covers the time before it, as
    ``Spec.current_price`` has it."""
    history: dict[int, list[PricePoint]] = defaultdict(list)
    rows = (
        SpecPrice.objects.filter(spec_id__in=set(spec_ids))
        .order_by("spec_id", "effective_from")
        .values_list("spec_id", "effective_from", "price_per_hour")
    )
    for spec_id, effective_from, price in rows:
        history[spec_id].append(PricePoint(effective_from, price))
    books = {}
    for spec_id, points in history.items():
        if points[0].effective_from > EPOCH:
            points.insert(0, PricePoint(EPOCH, points[0].price_per_hour))
        books[spec_id] = tuple(points)
    return books


# --- rating one segment ------------------------------------------------------------------


def rate(
    segment: UsageSegment, prices: dict[int, Sequence[PricePoint]], now: datetime
) -> tuple[RatedPiece | DiskPiece, ...]:
    """The segment's pieces as of ``now`` (nothing before it starts)."""
    if segment.started_at > now:
        return ()
    if segment.kind == UsageKind.GPU:
        return rate_segment(
            segment.started_at,
            segment.ended_at,
            prices[segment.spec_id],
            now=now,
            minimum_seconds=minimum_seconds(),
            run_before=segment.run_before,
        )
    return rate_disk(
        segment.started_at,
        segment.ended_at,
        segment.disk_gib,
        segment.disk_price_per_gib_month or Decimal(0),
        now=now,
    )


def unit_price(segment: UsageSegment, piece: RatedPiece | DiskPiece) -> Decimal:
    """Per hour for GPU pieces, per GiB-month for disk pieces."""
    if segment.kind == UsageKind.GPU:
        return piece.price_per_hour
    return segment.disk_price_per_gib_month or Decimal(0)


# What rating reads of a segment (a model instance or a ``SEGMENT_COLUMNS`` row).
SEGMENT_COLUMNS = (
    "pk",
    "tenant_id",
    "instance_id",
    "spec_id",
    "kind",
    "disk_gib",
    "disk_price_per_gib_month",
    "started_at",
    "ended_at",
    "run_before",
)


@dataclass(slots=True)
class PieceRow:
    """A piece as the meter computes it or reads it back (lighter than a model instance:
    the meter handles one per open segment every minute)."""

    segment_id: int
    tenant_id: int
    instance_id: int
    spec_id: int
    kind: str
    disk_gib: int
    month: date
    start: datetime
    end: datetime
    unit_price: Decimal
    seconds: int
    amount_micros: int
    is_final: bool
    pk: int | None = None


PIECE_COLUMNS = tuple(field.name for field in dataclasses.fields(PieceRow))


def _piece_row(segment, piece: RatedPiece | DiskPiece) -> PieceRow:
    return PieceRow(
        segment_id=segment.pk,
        tenant_id=segment.tenant_id,
        instance_id=segment.instance_id,
        spec_id=segment.spec_id,
        kind=segment.kind,
        disk_gib=segment.disk_gib,
        month=piece.month.date(),
        start=piece.start,
        end=piece.end,
        unit_price=unit_price(segment, piece),
        seconds=piece.seconds,
        amount_micros=decimal_to_micros(piece.amount),
        is_final=piece.is_final,
    )


def _same(stored: PieceRow, row: PieceRow) -> bool:
    return all(getattr(stored, name) == getattr(row, name) for name in PIECE_ATTRS)


def locked_segments(segments: QuerySet) -> list:
    """Lock ``segments`` in pk order and read what rating needs."""
    return list(locks.segments(segments).values_list(*SEGMENT_COLUMNS, named=True))


def frozen_months(tenant_ids: Iterable[int]) -> dict[tuple[int, date], int]:
    """(tenant, month) pairs whose invoice is issued, with that invoice: their pieces never
    change again (a change is billed later, as a ``UsageCorrection``)."""
    return {
        (tenant_id, month): pk
        for pk, tenant_id, month in Invoice.objects.filter(
            kind=Invoice.Kind.INVOICE, tenant_id__in=set(tenant_ids)
        )
        .exclude(status=Invoice.Status.DRAFT)
        .values_list("pk", "tenant_id", "month")
    }


def corrections_held(segment_ids: Iterable[int]) -> dict[tuple[int, datetime], tuple[int, int]]:
    """Per corrected piece (segment, start), the seconds and millionths its corrections
    already add."""
    held: dict[tuple[int, datetime], tuple[int, int]] = {}
    rows = UsageCorrection.objects.filter(segment_id__in=segment_ids).values_list(
        "segment_id", "start", "seconds", "amount_micros"
    )
    for segment_id, start, seconds, micros in rows:
        before = held.get((segment_id, start), (0, 0))
        held[(segment_id, start)] = (before[0] + seconds, before[1] + micros)
    return held


def correction(
    row: PieceRow | None,
    stored: PieceRow | None,
    held: tuple[int, int],
    invoice_id: int,
    now: datetime,
) -> list[UsageCorrection]:
    """What a piece of an issued month (``stored``, as invoiced; None: it had none) now
    rates at (``row``; None: nothing) and its corrections (``held``) do not bill yet: a
    correction billed in the month open at ``now``, or nothing."""
    base = row or stored
    seconds = (row.seconds if row else 0) - (stored.seconds if stored else 0) - held[0]
    micros = (row.amount_micros if row else 0) - (stored.amount_micros if stored else 0) - held[1]
    if not seconds and not micros:
        return []
    log.warning(
        "usage of segment %s in %s changed after its invoice was issued; the difference is "
        "billed in %s",
        base.segment_id,
        base.month,
        f"{now:%Y-%m}",
    )
    return [
        UsageCorrection(
            segment_id=base.segment_id,
            start=base.start,
            corrects_id=invoice_id,
            tenant_id=base.tenant_id,
            instance_id=base.instance_id,
            spec_id=base.spec_id,
            kind=base.kind,
            disk_gib=base.disk_gib,
            unit_price=base.unit_price,
            month=month_start(now).date(),
            seconds=seconds,
            amount_micros=micros,
            created_at=now,
        )
    ]


def store_pieces(
    segments: Sequence[UsageSegment], prices: dict[int, Sequence[PricePoint]], now: datetime
) -> int:
    """Rate ``segments`` (locked by the caller) as of ``now`` and make their stored pieces
    match: upsert what changed, delete what no longer exists, mark fully rated segments
    ``rated``, and make sure each (tenant, month) billed has an invoice (a draft). Pieces of
    months already invoiced stay as invoiced: what they now rate at beyond them and their
    corrections becomes a correction in the month open at ``now``. Answers how many pieces
    were written."""
    if not segments:
        return 0
    by_pk = {segment.pk: segment for segment in segments}
    frozen = frozen_months(segment.tenant_id for segment in segments)
    stored = {
        (piece.segment_id, piece.start): piece
        for piece in (
            PieceRow(*values)
            for values in UsagePiece.objects.filter(segment_id__in=by_pk).values_list(
                *PIECE_COLUMNS
            )
        )
    }
    held = corrections_held(by_pk)
    keep: set[tuple[int, datetime]] = set()
    upserts: list[PieceRow] = []
    fixes: list[UsageCorrection] = []
    rated: list[int] = []
    for segment in segments:
        pieces = rate(segment, prices, now)
        for piece in pieces:
            row = _piece_row(segment, piece)
            key = (segment.pk, row.start)
            keep.add(key)
            old = stored.get(key)
            invoice_id = frozen.get((segment.tenant_id, row.month))
            if invoice_id is not None:
                fixes += correction(row, old, held.get(key, (0, 0)), invoice_id, now)
            elif old is None or not _same(old, row):
                upserts.append(row)
        closed = segment.ended_at is not None and segment.ended_at <= now
        if closed and all(piece.is_final for piece in pieces):
            rated.append(segment.pk)
    stale = []
    for key, piece in stored.items():
        invoice_id = frozen.get((piece.tenant_id, piece.month))
        if key in keep:
            continue
        if invoice_id is None:
            stale.append(piece.pk)
        else:
            fixes += correction(None, piece, held.get(key, (0, 0)), invoice_id, now)
    if stale:
        UsagePiece.objects.filter(pk__in=stale).delete()
    if upserts:
        upsert_rows(UsagePiece, ("segment", "start"), PIECE_FIELDS, upserts)
    if fixes:
        UsageCorrection.objects.bulk_create(fixes)
    ensure_drafts({(row.tenant_id, row.month) for row in [*upserts, *fixes]})
    if rated:
        UsageSegment.objects.filter(pk__in=rated).update(rated=True)
    return len(upserts)


def ensure_drafts(pairs: set[tuple[int, date]]) -> None:
    """A draft invoice for each (tenant, month) that has none yet."""
    if not pairs:
        return
    tenants = {tenant_id for tenant_id, _ in pairs}
    months = {month for _, month in pairs}
    have = set(
        Invoice.objects.filter(
            kind=Invoice.Kind.INVOICE, tenant_id__in=tenants, month__in=months
        ).values_list("tenant_id", "month")
    )
    missing = [
        Invoice(tenant_id=tenant_id, month=month, currency=settings.BILLING_CURRENCY)
        for tenant_id, month in sorted(pairs - have)
    ]
    if missing:
        Invoice.objects.bulk_create(missing, ignore_conflicts=True)


def unrated(now: datetime, period: tuple[datetime, datetime] | None = None) -> QuerySet:
    segments = UsageSegment.objects.filter(rated=False, started_at__lte=now)
    if period is not None:
        start, end = period
        segments = segments.filter(started_at__lt=end).filter(
            Q(ended_at__isnull=True) | Q(ended_at__gte=start)
        )
    return segments


def mark_repriced() -> int:
    """Mark unrated every GPU segment that a price point added since the last look
    (``MeterCursor.price_id``) prices differently: those of its spec with time at or after
    its effective moment (all of them for a new first point, which also covers the time
    before it). ``rate_pending`` then rates them again. Answers how many were marked."""
    with transaction.atomic():
        cursor, _ = MeterCursor.objects.get_or_create(pk=1)
        new = list(
            SpecPrice.objects.filter(pk__gt=cursor.price_id).values_list(
                "pk", "spec_id", "effective_from"
            )
        )
        if not new:
            return 0
        since: dict[int, datetime] = {}
        for _, spec_id, effective_from in new:
            since[spec_id] = min(since.get(spec_id, effective_from), effective_from)
        first = dict(
            SpecPrice.objects.filter(spec_id__in=since)
            .values("spec_id")
            .annotate(first=Min("effective_from"))
            .values_list("spec_id", "first")
        )
        repriced = Q()
        for spec_id, moment in since.items():
            if moment <= first[spec_id]:
                moment = EPOCH
            repriced |= Q(spec_id=spec_id) & (Q(ended_at__isnull=True) | Q(ended_at__gt=moment))
        marked = (
            UsageSegment.objects.filter(kind=UsageKind.GPU, rated=True)
            .filter(repriced)
            .update(rated=False)
        )
        newest = max(pk for pk, _, _ in new)
        MeterCursor.objects.filter(pk=1, price_id__lt=newest).update(price_id=newest)
    return marked


def rate_pending(now: datetime | None = None, *, period=None, chunk_size: int = CHUNK_SIZE) -> int:
    """Rate every open or not yet rated segment (those overlapping ``period`` only, when
    given), those a new price point reprices included, in chunks, each in its own
    transaction with its segments locked in pk order. Answers how many pieces were
    written."""
    now = now or timezone.now()
    mark_repriced()
    pending = unrated(now, period)
    ids = list(pending.order_by("pk").values_list("pk", flat=True))
    if not ids:
        return 0
    prices = price_history(pending.order_by().values_list("spec_id", flat=True).distinct())
    written = 0
    for offset in range(0, len(ids), chunk_size):
        chunk = ids[offset : offset + chunk_size]
        with transaction.atomic():
            segments = locked_segments(UsageSegment.objects.filter(pk__in=chunk, rated=False))
            missing = {segment.spec_id for segment in segments} - prices.keys()
            if missing:  # a segment opened meanwhile with a spec we have not seen
                prices.update(price_history(missing))
            written += store_pieces(segments, prices, now)
    return written


# --- opening and closing -----------------------------------------------------------------


def _new_segment(
    instance: Instance,
    kind: str,
    started_at: datetime,
    *,
    spec: Spec | None = None,
    disk_price: Decimal | None = None,
    disk_gib: int | None = None,
    **fields,
) -> UsageSegment:
    """A segment of ``instance`` with ``spec``, ``disk_price`` and ``disk_gib`` (default:
    what holds now)."""
    spec = spec or instance.spec
    disk = kind == UsageKind.DISK
    if disk and disk_price is None:
        disk_price = disk_price_per_gib_month()
    disk_gib = disk_gib or instance.disk_gib or spec.disk_gib  # its disk, not the spec's
    return UsageSegment(
        tenant_id=instance.tenant_id,
        instance_id=instance.pk,
        kind=kind,
        spec_id=spec.pk,
        disk_gib=disk_gib if disk else 0,
        disk_price_per_gib_month=disk_price if disk else None,
        started_at=started_at,
        **fields,
    )


def open_segment(instance: Instance, kind: str, at: datetime) -> UsageSegment:
    """The instance entered the state ``kind`` bills for at ``at`` (a run: the one its
    tenant's last start began). Idempotent."""
    at = as_utc(at, "at")
    run = {"run_started_at": run_start(instance, at)} if kind == UsageKind.GPU else {}
    segment = _new_segment(instance, kind, at, **run)
    with transaction.atomic():
        segment, _ = UsageSegment.objects.get_or_create(
            instance_id=instance.pk,
            kind=kind,
            started_at=at,
            defaults={
                name: getattr(segment, name)
                for name in (
                    "tenant_id",
                    "spec_id",
                    "disk_gib",
                    "disk_price_per_gib_month",
                    "source",
                    "run_started_at",
                )
            },
        )
    earlier_open = UsageSegment.objects.filter(
        instance_id=instance.pk, kind=kind, ended_at__isnull=True, started_at__lt=at
    )
    if earlier_open.exists():  # the close of an earlier one was lost
        reconcile_instances([instance.pk])
    elif kind == UsageKind.GPU:
        settle_runs([instance.pk], segment.run_started_at)
    return segment


def close_segment(instance: Instance, kind: str, at: datetime, to_state: str = "") -> None:
    """The instance left the states ``kind`` bills for at ``at``, for ``to_state``; a
    segment that then bills nothing (``bills``) is dropped. Idempotent."""
    at = as_utc(at, "at")
    with transaction.atomic():
        open_segments = list(
            locks.segments(
                UsageSegment.objects.filter(
                    instance_id=instance.pk, kind=kind, ended_at__isnull=True, started_at__lte=at
                )
            ).values_list("pk", "started_at", "run_started_at", named=True)
        )
        open_ids = [segment.pk for segment in open_segments]
        if len(open_ids) == 1:
            if not bills(kind, Period(open_segments[0].started_at, at, None, to_state)):
                drop_segments(open_ids, at)
                return
            UsageSegment.objects.filter(pk=open_ids[0]).update(ended_at=at, rated=False)
            if kind == UsageKind.GPU:  # a later part of its run, opened first, follows it
                settle_runs([instance.pk], open_segments[0].run_started_at)
            return
    closed = UsageSegment.objects.filter(instance_id=instance.pk, kind=kind, ended_at=at)
    if open_ids or not closed.exists():  # lost open, or lost closes: the events know
        reconcile_instances([instance.pk])


def _holds_disk(instance: Instance, made: Q, removed: Q) -> bool:
    """Whether the last of the instance's events that made its disk (``made``: placements)
    or removed it (``removed``: shelves done) made it."""
    last = (
        InstanceEvent.objects.filter(instance_id=instance.pk)
        .filter((Q(to_state__in=PLACED_STATES) & made) | (Q(shelved=True) & removed))
        .order_by("-at", "-pk")
        .values_list("shelved", flat=True)
        .first()
    )
    return last is False


def has_disk(instance: Instance, at: datetime) -> bool:
    """Whether the instance had a disk at ``at``: placed by then, and not shelved since."""
    return _holds_disk(instance, Q(at__lte=at), Q(at__lte=at))


def placed_before(instance: Instance, at: datetime) -> bool:
    """Whether the instance had a disk before its placement at ``at``: placed earlier, and
    not shelved since (a shelve done at that instant comes first)."""
    return _holds_disk(instance, Q(at__lt=at), Q(at__lte=at))


def run_start(instance: Instance, at: datetime) -> datetime | None:
    """When the run going on at ``at`` began: the instance's launch or last start its tenant
    asked for by then (``RUN_OPENERS``)."""
    return (
        InstanceEvent.objects.filter(instance_id=instance.pk, at__lte=at)
        .filter(RUN_OPENERS)
        .order_by("-at", "-pk")
        .values_list("at", flat=True)
        .first()
    )


def settle_runs(instance_ids: Iterable[int], run_started_at: datetime | None = None) -> int:
    """Give each GPU segment of the instances (of their run begun at ``run_started_at`` only,
    when given) the time its run ran in the run's earlier segments (``run_before``; None for
    the first), marking unrated those it changes, so that a run is billed one minimum and
    one rounding up, whatever split it (a segment repaired or pulled back included). Answers
    how many changed."""
    runs = Q(run_started_at__isnull=False)
    if run_started_at is not None:
        runs = Q(run_started_at=run_started_at)
    rows = (
        UsageSegment.objects.filter(runs, instance_id__in=set(instance_ids), kind=UsageKind.GPU)
        .order_by("instance_id", "run_started_at", "started_at", "pk")
        .values_list("pk", "instance_id", "run_started_at", "started_at", "ended_at", "run_before")
    )
    changed: dict[int, timedelta | None] = {}
    run, ran = None, None
    for pk, instance_id, began, started_at, ended_at, run_before in rows:
        if (instance_id, began) != run:
            run, ran = (instance_id, began), None
        if run_before != ran:
            changed[pk] = ran
        ran = (ran or timedelta(0)) + ((ended_at or started_at) - started_at)
    for pk, ran in changed.items():
        UsageSegment.objects.filter(pk=pk).update(run_before=ran, rated=False)
    return len(changed)


def record_transition(instance: Instance, from_state: str, to_state: str, at: datetime) -> None:
    """Open and close the segments a transition implies (the signal receiver's work)."""
    if from_state == to_state == State.RUNNING:  # a live resize: the run goes on, new spec
        close_segment(instance, UsageKind.GPU, at, to_state)
        open_segment(instance, UsageKind.GPU, at)
        return
    if from_state == to_state:  # a shelve done: its disk is on no host from here
        if not has_disk(instance, at):
            close_segment(instance, UsageKind.DISK, at, to_state)
        return
    for kind, states in KIND_STATES.items():
        if from_state in states and to_state not in states:
            close_segment(instance, kind, at, to_state)
    for kind, states in KIND_STATES.items():
        if to_state not in states:
            continue
        if kind == UsageKind.GPU:
            opens = from_state not in states
        else:  # where the disk is made (its first placement, from a first pending too) or
            # where it is billed again after a run
            opens = has_disk(instance, at) and (
                from_state not in states or not placed_before(instance, at)
            )
        if opens:
            open_segment(instance, kind, at)


def bills(kind: str, period: "Period") -> bool:
    """Whether a period is billed: one of no length is not, a disk's (nothing to bill) or a
    run that failed at the instant it began (its workload never ran: a command not in the
    image, an image that could not be pulled); any other run bills at least the minimum."""
    if period.end != period.start:
        return True
    return kind == UsageKind.GPU and period.ended_by != State.FAILED


def drop_segments(segment_ids: Sequence[int], at: datetime) -> int:
    """Delete segments that bill nothing, with their pieces; one with a piece in an issued
    month stays, closed at ``at`` (the invoice stands). Answers how many went."""
    pieces = UsagePiece.objects.filter(segment_id__in=segment_ids)
    months = set(pieces.values_list("tenant_id", "month"))
    frozen = months & frozen_months(tenant_id for tenant_id, _ in months).keys()
    kept = set(
        pieces.filter(month__in={month for _, month in frozen}).values_list("segment_id", flat=True)
    )
    UsageSegment.objects.filter(pk__in=kept).update(ended_at=at, rated=False)
    deleted, _ = UsageSegment.objects.filter(pk__in=set(segment_ids) - kept).delete()
    return deleted


def end_at_last_heartbeat(instance: Instance, at: datetime) -> int:
    """The instance's host was lost; its last heartbeat was ``at``. Billing of the GPU ends
    there whatever was asked meanwhile: a segment closed later (a stop or a reboot requested
    while the host was already silent) is pulled back to ``at``. Segments are first repaired
    from the events, so a lost signal cannot hide one. Answers how many were pulled back."""
    at = as_utc(at, "at")
    reconcile_instances([instance.pk])
    pulled = UsageSegment.objects.filter(
        instance_id=instance.pk, kind=UsageKind.GPU, started_at__lte=at, ended_at__gt=at
    ).update(ended_at=at, rated=False)
    settle_runs([instance.pk])
    return pulled


# --- repair from the event history -------------------------------------------------------


@dataclass(frozen=True)
class Period:
    """Time an instance spent in a billed state, with the spec and (disk periods) the disk
    size it had (None: not recorded on its events, which are older than
    ``InstanceEvent.spec`` and ``InstanceEvent.disk_gib``) and the state it left for."""

    start: datetime
    end: datetime | None
    spec_id: int | None
    ended_by: str = ""
    disk_gib: int | None = None
    run_started_at: datetime | None = None  # GPU periods: when the tenant started the run


# (from_state, to_state, at, spec_id, disk_gib, continues_run, shelved), as on InstanceEvent
Event = tuple[str, str, datetime, int | None, int | None, bool, bool]
EVENT_COLUMNS = (
    "from_state",
    "to_state",
    "at",
    "spec_id",
    "disk_gib",
    "continues_run",
    "shelved",
)


def periods_from_events(events: Iterable[Event]) -> dict[str, list[Period]]:
    """Per segment kind, the periods the instance spent in its states, from its events
    (``Event``) in order; the last one may still be open (end None). A period has the spec
    and disk size of the event that began it, as a segment opened by the signal does, and a
    GPU period the start of its run (its launch or its tenant's last start: ``opens_run``).
    Time before the instance was placed has no disk, nor has time from a shelve done until
    it is placed again: no disk period. A disk that grows (a resize while stopped: a note)
    begins a new period at its new size; so does a run whose spec changes live (a resize's
    note while running)."""
    periods: dict[str, list[Period]] = {kind: [] for kind in KIND_STATES}
    placed = False
    run_started_at = None
    for from_state, to_state, at, spec_id, disk_gib, continues_run, shelved in events:
        placed = (placed or to_state in PLACED_STATES) and not shelved
        if opens_run(from_state, to_state, continues_run):
            run_started_at = at
        for kind, billed in KIND_STATES.items():
            spans = periods[kind]
            is_open = bool(spans) and spans[-1].end is None
            bills_now = to_state in billed and (placed or kind != UsageKind.DISK)
            grown = (
                is_open
                and kind == UsageKind.DISK
                and disk_gib is not None
                and spans[-1].disk_gib is not None
                and disk_gib != spans[-1].disk_gib
            )
            # a live resize: the run goes on at another spec (a note in `running`)
            respecced = (
                is_open
                and kind == UsageKind.GPU
                and None not in (spec_id, spans[-1].spec_id)
                and spec_id != spans[-1].spec_id
            )
            if is_open and (not bills_now or grown or respecced):
                spans[-1] = dataclasses.replace(spans[-1], end=at, ended_by=to_state)
            if bills_now and (not is_open or grown or respecced):
                if kind == UsageKind.DISK and spans and spans[-1].start == spans[-1].end == at:
                    spans.pop()  # of no length, so billed nothing: one period per start
                run = run_started_at if kind == UsageKind.GPU else None
                spans.append(Period(at, None, spec_id, disk_gib=disk_gib, run_started_at=run))
    return periods


def disk_price_at(at: datetime) -> Decimal:
    """The disk price in force at ``at``: as the last disk segment opened by a state change
    by then recorded it (``BILLING_DISK_PRICE_PER_GIB_MONTH`` then), else the setting now."""
    recorded = (
        UsageSegment.objects.filter(
            kind=UsageKind.DISK, source=UsageSegment.Source.SIGNAL, started_at__lte=at
        )
        .order_by("-started_at", "-pk")
        .values_list("disk_price_per_gib_month", flat=True)
        .first()
    )
    return recorded if recorded is not None else disk_price_per_gib_month()


def reconcile_instances(instance_ids: Iterable[int]) -> int:
    """Make the instances' segments match their event history: create the segments of
    periods that have none (each with the spec it had then, the disk of that spec and the
    disk price of that time, a GPU segment the run it is part of), close open segments whose
    period ended, pull back to its period's end a segment closed later than that (never
    forward: a GPU segment ended at a lost host's last heartbeat stays there), drop those of
    periods that bill nothing, and settle the runs (``settle_runs``). Answers how many
    segments were created, closed, dropped or given to another run."""
    instance_ids = sorted(set(instance_ids))
    if not instance_ids:
        return 0
    events: dict[int, list[Event]] = defaultdict(list)
    rows = (
        InstanceEvent.objects.filter(instance_id__in=instance_ids)
        .order_by("instance_id", "at", "pk")
        .values_list("instance_id", *EVENT_COLUMNS)
    )
    for instance_id, *event in rows:
        events[instance_id].append(tuple(event))
    instances = {
        instance.pk: instance
        for instance in Instance.objects.filter(pk__in=events).select_related("spec")
    }
    specs = Spec.objects.in_bulk(
        {event[3] for history in events.values() for event in history if event[3]}
    )
    segments = {
        (segment.instance_id, segment.kind, segment.started_at): segment
        for segment in UsageSegment.objects.filter(instance_id__in=events)
    }
    to_create: list[UsageSegment] = []
    to_close: list[tuple[int, datetime]] = []
    to_drop: list[tuple[int, datetime]] = []
    to_rerun: list[tuple[int, datetime]] = []  # GPU segments given to another run
    for instance_id, history in events.items():
        instance = instances.get(instance_id)
        if instance is None:
            continue
        for kind, periods in periods_from_events(history).items():
            billed = {period.start for period in periods if bills(kind, period)}
            for period in periods:
                segment = segments.get((instance_id, kind, period.start))
                if period.start not in billed:
                    if segment is not None:  # opened by its signal; its period bills nothing
                        to_drop.append((segment.pk, period.start))
                    continue
                if segment is None:
                    to_create.append(
                        _new_segment(
                            instance,
                            kind,
                            period.start,
                            spec=specs.get(period.spec_id),
                            disk_gib=period.disk_gib,
                            disk_price=disk_price_at(period.start)
                            if kind == UsageKind.DISK
                            else None,
                            ended_at=period.end,
                            run_started_at=period.run_started_at,
                            source=UsageSegment.Source.REPAIR,
                        )
                    )
                    continue
                if segment.run_started_at not in (None, period.run_started_at):
                    to_rerun.append((segment.pk, period.run_started_at))
                if period.end is not None and (
                    segment.ended_at is None or segment.ended_at > period.end
                ):
                    # open, or closed too late: a close signal lost, and the next close of
                    # the same kind (a later period's) taken for it
                    to_close.append((segment.pk, period.end))
    changed = 0
    with transaction.atomic():
        if to_create:
            created = UsageSegment.objects.bulk_create(to_create, ignore_conflicts=True)
            changed += len(created)
        for pk, end in sorted(to_close):
            changed += (
                UsageSegment.objects.filter(pk=pk)
                .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=end))
                .update(ended_at=end, rated=False)
            )
        for pk, start in sorted(to_drop):
            changed += drop_segments([pk], start)
        for pk, run_started_at in sorted(to_rerun):
            changed += UsageSegment.objects.filter(pk=pk).update(
                run_started_at=run_started_at, rated=False
            )
        settle_runs(instance_ids)
    if changed:
        log.warning(
            "billing repaired %d segment(s) of instance(s) %s from their events",
            changed,
            ", ".join(map(str, instance_ids)),
        )
    return changed


def instances_to_reconcile(now: datetime, window: timedelta = REPAIR_WINDOW) -> set[int]:
    """Instances whose segments may not match their history: in a billed state without an
    open segment (for the disk: while it has one, placed and not shelved since), with an
    open segment while out of its states, or with a recent transition or shelve."""
    candidates: set[int] = set()
    shelved_last = Subquery(
        InstanceEvent.objects.filter(instance=OuterRef("pk"))
        .filter(Q(to_state__in=PLACED_STATES) | Q(shelved=True))
        .order_by("-at", "-pk")
        .values("shelved")[:1]
    )
    for kind, states in KIND_STATES.items():
        open_segment_of = UsageSegment.objects.filter(
            instance=OuterRef("pk"), kind=kind, ended_at__isnull=True
        )
        billed = Instance.objects.filter(state__in=states).exclude(Exists(open_segment_of))
        if kind == UsageKind.DISK:
            billed = billed.annotate(shelved_last=shelved_last).filter(shelved_last=False)
        candidates.update(billed.values_list("pk", flat=True))
        candidates.update(
            UsageSegment.objects.filter(kind=kind, ended_at__isnull=True)
            .exclude(instance__state__in=states)
            .values_list("instance_id", flat=True)
        )
    candidates.update(
        InstanceEvent.objects.filter(at__gte=now - window)
        .exclude(Q(from_state=F("to_state")) & Q(shelved=False))
        .values_list("instance_id", flat=True)
        .distinct()
    )
    return candidates


def reconcile(now: datetime | None = None, window: timedelta = REPAIR_WINDOW) -> int:
    """Repair segments from the event history: the instances of ``instances_to_reconcile``
    and those with a transition since the last run (MeterCursor), however long ago it was."""
    now = now or timezone.now()
    cursor, _ = MeterCursor.objects.get_or_create(pk=1)
    newest = InstanceEvent.objects.aggregate(newest=Max("pk"))["newest"] or 0
    unseen = (
        InstanceEvent.objects.filter(pk__gt=cursor.event_id, pk__lte=newest)
        .values_list("instance_id", flat=True)
        .distinct()
    )
    changed = reconcile_instances(instances_to_reconcile(now, window) | set(unseen))
    MeterCursor.objects.filter(pk=1, event_id__lt=newest).update(event_id=newest)
    return changed
