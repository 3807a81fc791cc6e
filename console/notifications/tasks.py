"""Notifications' Celery tasks (the default queue). Each takes a primary key or nothing and
is idempotent: a delivery is attempted only while it is pending and due, which an attempt's
claim changes (services.attempt_delivery)."""

from celery import shared_task

from console.notifications import services

OPTIONS = {"ignore_result": True, "acks_late": True, "reject_on_worker_lost": True}


@shared_task(name="console.notifications.tasks.deliver", **OPTIONS)
def deliver(delivery_pk: int) -> None:
    services.attempt_delivery(delivery_pk)


@shared_task(name="console.notifications.tasks.sweep", **OPTIONS)
def sweep() -> None:
    """Every NOTIFICATIONS_SWEEP_SECONDS: queue the deliveries that are due."""
    services.queue_due()
