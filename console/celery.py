import logging.config
import os

from celery import Celery, signals
from django.db import transaction

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("gpucloud")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def enqueue_on_commit(task_name: str, *args, countdown: float | None = None) -> None:
    """Queue the task registered as ``task_name`` once the current transaction commits (at
    once outside one), to run `countdown` seconds later if given. By its pinned name, so that
    a module queues work without importing the module (or the layer) that does it."""
    transaction.on_commit(
        lambda: app.signature(task_name, args=args).apply_async(countdown=countdown)
    )


@signals.setup_logging.connect
def _log_as_the_settings_say(**kwargs):
    """Workers and beat log as the settings' LOGGING says (LOG_LEVEL, LOG_FORMAT), not as
    Celery's own set-up would (its default level, WARNING, shows no task at all)."""
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)
