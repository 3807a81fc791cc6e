import os
from functools import cached_property

from celery import Celery, signals
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from console import state_dir

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")


class App(Celery):
    """The gpucloud Celery app: its worker and beat say their banners and shutdown lines in
    the log's format (console.celery_banners)."""

    @cached_property
    def Worker(self):
        return self.subclass_with_self("console.celery_banners:Worker")

    @cached_property
    def Beat(self):
        return self.subclass_with_self("console.celery_banners:Beat")


app = App("gpucloud")


@app.on_configure.connect
def _prepare_state_dir(**kwargs) -> None:
    """A worker's or beat's start: its state directory is made before the app reads Django's
    settings (console.state_dir). Not where the settings were read already (a web process, a
    manage.py command, which made it then): the database may be open there, and a file of it
    opened and closed again would drop its SQLite locks."""
    if not settings.configured:
        state_dir.prepare()


app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def enqueue_on_commit(task_name: str, *args, countdown: float | None = None) -> None:
    """Queue the task registered as ``task_name`` once the current transaction commits (at
    once outside one), to run `countdown` seconds later if given. By its pinned name, so that
    a module queues work without importing the module (or the layer) that does it. Refused
    before the transaction commits when the task could never reach a worker, so that the
    change it belongs to is not half done."""
    refuse_in_memory_broker(task_name)
    transaction.on_commit(
        lambda: app.signature(task_name, args=args).apply_async(countdown=countdown)
    )


@signals.setup_logging.connect
def _log_as_the_settings_say(**kwargs):
    """Workers and beat log as the settings' LOGGING says (LOG_LEVEL, LOG_FORMAT), not as
    Celery's own set-up would (its default level, WARNING, shows no task at all)."""
    from console import logs

    logs.configure()


@signals.before_task_publish.connect
def refuse_in_memory_broker(sender: str, **kwargs) -> None:
    """A process without REDIS_URL has an in-memory broker (memory://) that no worker reads:
    a task queued there is lost without a word (a `manage.py shell` against a running console,
    say). Only the tests (ALLOW_IN_MEMORY_BROKER) and eager runs may queue to it; `make run`
    gives every process it starts its Redis."""
    if app.conf.task_always_eager or settings.ALLOW_IN_MEMORY_BROKER:
        return
    if settings.CELERY_BROKER_URL.startswith("memory://"):
        raise ImproperlyConfigured(
            f"REDIS_URL is not set: this process's Celery broker is in memory, so the task "
            f"{sender} would never reach a worker. Set REDIS_URL to the console's Redis (as "
            "its web and worker processes have it; `make run` prints its URL) and run again."
        )
