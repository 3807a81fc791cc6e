"""Stored data on the bill: volumes and snapshots, each a line of its own, rated per
GiB-second at the price per GiB-month its region had when it was made (``rating.rate_disk``:
split at UTC month starts, seconds rounded up cumulatively, no minimum).

- A volume is billed for its size from its creation to its deletion, whatever its instances do.
- A snapshot is billed for the data it added to the snapshot store (``bytes_stored``) from the
  moment it is done to its deletion.

Their usage follows from their rows alone: size, stored bytes and price never change once
billing starts, and a deletion is stamped when it happens, never in the past. So they are rated
from the rows whenever asked, the same every time (no stored pieces, nothing a second run could
change): live for the usage page, drafts, exports and budgets, and into the invoice's lines at
finalization."""

from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

from django.db.models import Q, QuerySet

from billing.metering import ensure_drafts
from billing.models import UsageKind, bytes_to_gib
from billing.rating import DiskPiece, month_start, next_month_start, rate_disk
from console.snapshots.models import Snapshot
from console.volumes.models import Volume

GIB = Decimal(1024**3)


@dataclass(frozen=True)
class StoredPiece:
    """A volume's or a snapshot's piece of a month."""

    kind: str  # UsageKind.VOLUME or UsageKind.SNAPSHOT
    pk: int  # the volume's or the snapshot's
    tenant_id: int
    name: str  # the volume's; the snapshot's source (an instance or a volume)
    gib: Decimal  # a volume's size; the data a snapshot stores
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
    """Done snapshots that store data, of the tenants (None: of every tenant), that were
    kept at some time in [start, end)."""
    snapshots = Snapshot.objects.filter(
        finished_at__lt=end, state=Snapshot.State.DONE, bytes_stored__gt=0
    ).filter(Q(deleted_at__isnull=True) | Q(deleted_at__gt=start))
    if tenant_ids is not None:
        snapshots = snapshots.filter(tenant_id__in=tenant_ids)
    return snapshots.order_by("pk")


def _pieces(kind, row, since, gib, month_start_at, now) -> list[StoredPiece]:
    ended = row.deleted_at if row.deleted_at and row.deleted_at <= now else None
    return [
        StoredPiece(
            kind=kind,
            pk=row.pk,
            tenant_id=row.tenant_id,
            name=row.name if kind == UsageKind.VOLUME else row.source_name,
            gib=gib,
            price_per_gib_month=row.price_per_gib_month,
            since=since,
            piece=piece,
        )
        for piece in rate_disk(since, ended, gib, row.price_per_gib_month, now=now)
        if piece.month == month_start_at
    ]


def month_pieces(tenant_ids, month: date, now: datetime) -> list[StoredPiece]:
    """Each volume's and snapshot's piece of ``month`` as of ``now`` (one made later: none)."""
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    until = min(next_month_start(start), now)
    pieces = []
    for volume in volumes_in(tenant_ids, start, until):
        gib = Decimal(volume.size_gib)
        pieces += _pieces(UsageKind.VOLUME, volume, volume.created_at, gib, start, now)
    for snapshot in snapshots_in(tenant_ids, start, until):
        gib = bytes_to_gib(snapshot.bytes_stored)  # every digit: its line shows them
        pieces += _pieces(UsageKind.SNAPSHOT, snapshot, snapshot.finished_at, gib, start, now)
    return pieces


def _tenants(start: datetime, end: datetime) -> set[int]:
    return set(volumes_in(None, start, end).values_list("tenant_id", flat=True)) | set(
        snapshots_in(None, start, end).values_list("tenant_id", flat=True)
    )


def tenants_billed(month: date) -> set[int]:
    """The tenants whose volumes or snapshots cost something in ``month``."""
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    return _tenants(start, next_month_start(start))


def ensure_current_drafts(now: datetime) -> None:
    """A draft invoice of the month of ``now`` for every tenant with a volume or a snapshot in
    it (its GPU usage makes one too, when it has any)."""
    month = month_start(now).date()
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    ensure_drafts({(tenant_id, month) for tenant_id in _tenants(start, now)})
