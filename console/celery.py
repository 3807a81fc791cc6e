import logging.config
import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("gpucloud")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.setup_logging.connect
def _log_as_the_settings_say(**kwargs):
    """Workers and beat log as the settings' LOGGING says (LOG_LEVEL, LOG_FORMAT), not as
    Celery's own set-up would (its default level, WARNING, shows no task at all)."""
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)
