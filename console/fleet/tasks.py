"""Periodic fleet work (see settings.CELERY_BEAT_SCHEDULE)."""

from celery import shared_task

from console.fleet import services


@shared_task(name="console.fleet.tasks.watchdog", ignore_result=True)
def watchdog(grace_seconds: float | None = None) -> list[str]:
    """Mark hosts whose agent went silent `unreachable`; heartbeats bring them back."""
    return [host.name for host in services.mark_silent_hosts_unreachable(grace_seconds)]
