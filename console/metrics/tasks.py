"""Periodic metrics work: settings.CELERY_BEAT_SCHEDULE runs `downsample` every minute, and
settings.CELERY_TASK_ROUTES sends it to the `metrics` queue."""

from celery import shared_task

from console.metrics import history


@shared_task(name="console.metrics.tasks.downsample", ignore_result=True)
def downsample() -> dict:
    """Fold the finished minutes of the live window into history rows; drop old history.
    Idempotent: a second run, or a redelivery, writes the same rows."""
    return history.downsample()
