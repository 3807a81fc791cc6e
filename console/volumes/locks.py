"""Row locks of volumes. They come after the instance's row (console/instances/locks.py):
attach, detach and terminate lock the instance first, then its volumes in primary-key order
(accounts/locks.py states the whole order)."""

from console.volumes.models import Volume


def volume(pk: int) -> Volume | None:
    return Volume.objects.select_for_update().filter(pk=pk).first()


def of_instance(instance_id: int) -> list[Volume]:
    """The volumes attached to the instance, whose row the caller holds."""
    return list(Volume.objects.select_for_update().filter(instance_id=instance_id).order_by("pk"))
