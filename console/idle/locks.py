"""Row locks of idle policies' watches. An instance's watch comes after the instance's row
(console/instances/locks.py), which its callers hold (accounts/locks.py states the order)."""

from console.idle.models import Watch


def watch(instance) -> Watch:
    """The instance's watch, locked (made on its first look)."""
    found, _ = Watch.objects.select_for_update().get_or_create(instance=instance)
    return found
