"""Row locks of snapshots, schedules, shelves and restores. They come after the instance's row
(console/instances/locks.py) and a volume's (console/volumes/locks.py): a shelf after its
instance, its snapshots after the shelf, in primary-key order; a schedule or a snapshot alone
or after its volume (accounts/locks.py states the whole order)."""

from console.snapshots.models import Restore, Schedule, Shelf, Snapshot


def snapshot(pk: int) -> Snapshot | None:
    return Snapshot.objects.select_for_update().filter(pk=pk).first()


def snapshots(**of) -> list[Snapshot]:
    """The snapshots matching `of`, newest first (a schedule's, to keep N of them)."""
    return list(Snapshot.objects.select_for_update().filter(**of).order_by("-finished_at", "-pk"))


def shelf_snapshots(shelf: Shelf) -> list[Snapshot]:
    """The shelf's snapshots with their volumes, in primary-key order (the shelf held)."""
    return list(
        shelf.snapshots.select_for_update(of=("self",)).select_related("volume").order_by("pk")
    )


def schedule(**of) -> Schedule | None:
    return Schedule.objects.select_for_update().filter(**of).first()


def shelf(**of) -> Shelf | None:
    return Shelf.objects.select_for_update().filter(**of).first()


def restore(pk: int) -> Restore | None:
    return Restore.objects.select_for_update().filter(pk=pk).first()
