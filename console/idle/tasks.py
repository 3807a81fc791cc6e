"""The idle watch's round: settings.CELERY_BEAT_SCHEDULE sends `evaluate` every
IDLE_CHECK_SECONDS (default 30 s). Idempotent: a round sent twice, or redelivered, finds each
warning sent and each action taken."""

from celery import shared_task

from console.idle import services


@shared_task(name="console.idle.tasks.evaluate", ignore_result=True)
def evaluate() -> dict:
    return services.evaluate_all()
