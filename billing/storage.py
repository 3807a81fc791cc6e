"""Stored data on the bill: volumes and snapshots, each a line of its own, rated per
GiB-second at the price per GiB-month its region had when it was made (``rating.rate_disk``:
split at UTC month starts, seconds rounded up cumulatively, no minimum).

- A volume is billed for its size from its creation to its deletion, whatever its instances do.
- Snapshots are billed for what their tenant's repository holds: each measurement of it (taken
  by restic after every backup, forget and prune there, console.snapshots.StoreMeasurement) is
  billed from its second until the next measurement's, at its price; a line per size held.
  Deleting a snapshot lowers the bill once the prune's measurement says its unique data is gone.
- A snapshot taken before the store was split per tenant (the shared repository, whose data
  may be any tenant's) is billed as it was: for the data it added to that store
  (``bytes_stored``) from the moment it is done to its deletion.

Their usage follows from their rows alone: sizes, measurements and prices never change once
billing starts, and a deletion or a measurement is stamped when it happens, never in the past.
So they are rated from the rows whenever asked, the same every time (no stored pieces, nothing
a second run could change): live for the usage page, drafts, exports and budgets, and into the
invoice's lines at finalization."""

from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from itertools import pairwise

from django.db.models import OuterRef, Q, QuerySet, Subquery

from billing.metering import ensure_drafts
from billing.models import UsageKind, bytes_to_gib
from billing.rating import DiskPiece, month_start, next_month_start, rate_disk
from console.snapshots.models import Snapshot, StoreMeasurement
from console.volumes.models import Volume

STORE_NAME = "snapshot store"  # the name on a tenant's repository's lines


@dataclass(frozen=True)
class StoredPiece:
    """A volume's, a shared-store snapshot's or a tenant repository's piece of a month."""

    kind: str  # UsageKind.VOLUME or UsageKind.SNAPSHOT
    pk: int  # the volume's or the snapshot's; 0: the tenant's repository
    tenant_id: int
    name: str  # the volume's; the snapshot's source (an instance or a volume); STORE_NAME
    gib: Decimal  # a volume's size; the data a snapshot or the tenant's repository stores
    price_per_gib_month: Decimal
    since: datetime  # when its billing started
    piece: DiskPiece


def volumes_in(tenant_ids, start: datetime, end: datetime) -> QuerySet:
    """Volumes of the tenants (None: of every tenant) that existed at some time in
    [start, end)."""
    volumes = Volume.objects.filter(created_at__lt=end).filter(
        Q(deleted_at__isnull=True) | Q(deleted_at__gt=start)
    )
    if tenant_ids is not None:
        volumes = volumes.filter(tenant_id__in=tenant_ids)
    return volumes.order_by("pk")


def snapshots_in(tenant_ids, start: datetime, end: datetime) -> QuerySet:
    """Done snapshots of the shared store that store data, of the tenants (None: of every
    tenant), that were kept at some time in [start, end)."""
    snapshots = Snapshot.objects.filter(
        finished_at__lt=end,
        state=Snapshot.State.DONE,
        store=Snapshot.Store.LEGACY,
        bytes_stored__gt=0,
    ).filter(Q(deleted_at__isnull=True) | Q(deleted_at__gt=start))
    if tenant_ids is not None:
        snapshots = snapshots.filter(tenant_id__in=tenant_ids)
    return snapshots.order_by("pk")


@dataclass(frozen=True)
class Held:
    """What a tenant's repository held from one measurement (``since``) until the next
    (``until``; None: none yet)."""

    tenant_id: int
    since: datetime
    until: datetime | None
    bytes: int
    price_per_gib_month: Decimal


def held_in(tenant_ids, start: datetime, end: datetime) -> list[Held]:
    """What the repositories of the tenants (None: of every tenant) held at some time in
    [start, end), in order: each measurement from its second until the next one's (of two in
    one second, the later counts), the last one before ``start`` included."""
    measurements = StoreMeasurement.objects.all()
    if tenant_ids is not None:
        measurements = measurements.filter(tenant_id__in=tenant_ids)
    opening = (
        StoreMeasurement.objects.filter(tenant_id=OuterRef("tenant_id"), measured_at__lt=start)
        .order_by("-measured_at", "-pk")
        .values("pk")[:1]
    )
    rows = (
        measurements.filter(measured_at__lt=end)
        .filter(Q(measured_at__gte=start) | Q(pk=Subquery(opening)))
        .order_by("tenant_id", "measured_at", "pk")
        .values_list("tenant_id", "measured_at", "bytes", "price_per_gib_month")
    )
    latest: dict[tuple[int, datetime], tuple[int, Decimal]] = {}
    for tenant_id, measured_at, size, price in rows:
        latest[(tenant_id, measured_at)] = (size, price)
    keys = list(latest)
    held = []
    for (tenant_id, since), after in pairwise([*keys, None]):
        until = after[1] if after is not None and after[0] == tenant_id else None
        size, price = latest[(tenant_id, since)]
        held.append(Held(tenant_id, since, until, size, price))
    return held


def _pieces(kind, pk, tenant_id, name, gib, price, since, until, month_start_at, now):
    ended = until if until is not None and until <= now else None
    return [
        StoredPiece(
            kind=kind,
            pk=pk,
            tenant_id=tenant_id,
            name=name,
            gib=gib,
            price_per_gib_month=price,
            since=since,
            piece=piece,
        )
        for piece in rate_disk(since, ended, gib, price, now=now)
        if piece.month == month_start_at
    ]


def month_pieces(tenant_ids, month: date, now: datetime) -> list[StoredPiece]:
    """Each volume's and snapshot's piece of ``month`` as of ``now`` (one made later: none)."""
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    until = min(next_month_start(start), now)
    pieces = []
    for volume in volumes_in(tenant_ids, start, until):
        of = (UsageKind.VOLUME, volume.pk, volume.tenant_id, volume.name)
        pieces += _pieces(
            *of, Decimal(volume.size_gib), volume.price_per_gib_month,
            volume.created_at, volume.deleted_at, start, now,
        )  # fmt: skip
    for snapshot in snapshots_in(tenant_ids, start, until):
        of = (UsageKind.SNAPSHOT, snapshot.pk, snapshot.tenant_id, snapshot.source_name)
        pieces += _pieces(
            *of, bytes_to_gib(snapshot.bytes_stored), snapshot.price_per_gib_month,
            snapshot.finished_at, snapshot.deleted_at, start, now,
        )  # fmt: skip
    for held in held_in(tenant_ids, start, until):
        if held.bytes:
            of = (UsageKind.SNAPSHOT, 0, held.tenant_id, STORE_NAME)
            pieces += _pieces(
                *of, bytes_to_gib(held.bytes), held.price_per_gib_month,
                held.since, held.until, start, now,
            )  # fmt: skip
    return pieces


def _tenants(start: datetime, end: datetime) -> set[int]:
    return (
        set(volumes_in(None, start, end).values_list("tenant_id", flat=True))
        | set(snapshots_in(None, start, end).values_list("tenant_id", flat=True))
        | {held.tenant_id for held in held_in(None, start, end) if held.bytes}
    )


def tenants_billed(month: date) -> set[int]:
    """The tenants whose volumes, snapshots or repositories cost something in ``month``."""
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    return _tenants(start, next_month_start(start))


def ensure_current_drafts(now: datetime) -> None:
    """A draft invoice of the month of ``now`` for every tenant with a volume, a snapshot or a
    repository that holds data in it (its GPU usage makes one too, when it has any)."""
    month = month_start(now).date()
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    ensure_drafts({(tenant_id, month) for tenant_id in _tenants(start, now)})
