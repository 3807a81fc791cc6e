"""Periodic fleet work (see settings.CELERY_BEAT_SCHEDULE)."""

from celery import shared_task
from django.conf import settings

from console.fleet import identity, images, services
from console.fleet.agent_client import RETRIED_WHILE_UNAVAILABLE, AgentUnavailable


@shared_task(name="console.fleet.tasks.watchdog", ignore_result=True)
def watchdog(grace_seconds: float | None = None) -> list[str]:
    """Mark hosts whose agent went silent `unreachable`; heartbeats bring them back."""
    return [host.name for host in services.mark_silent_hosts_unreachable(grace_seconds)]


@shared_task(name="console.fleet.tasks.certify_due_gateways", ignore_result=True)
def certify_due_gateways() -> list[int]:
    """Renew the SSH gateways' certificates that expire soon (and retry any push that failed)."""
    return services.certify_due_gateways()


@shared_task(
    name="console.fleet.tasks.certify_gateway",
    **RETRIED_WHILE_UNAVAILABLE,
)
def certify_gateway(host_pk: int) -> bool:
    """Give a host's SSH gateway a certificate of the console's CA (new or renewed)."""
    return services.certify_gateway(host_pk)


@shared_task(
    name="console.fleet.tasks.push_image_settings",
    **RETRIED_WHILE_UNAVAILABLE,
)
def push_image_settings(host_pk: int) -> bool:
    """Hand a host's agent the images to pre-pull and its region's registry mirror."""
    return images.push_settings(host_pk)


@shared_task(name="console.fleet.tasks.push_due_image_settings", ignore_result=True)
def push_due_image_settings() -> list[int]:
    """Push the image settings to every host whose agent applies others (it lost its state,
    or a push ran out of retries)."""
    return images.push_due()


@shared_task(
    name="console.fleet.tasks.clean_up_images",
    autoretry_for=(AgentUnavailable,),
    retry_backoff=settings.INSTANCE_AGENT_RETRY_BACKOFF,
    max_retries=3,
)
def clean_up_images(host_pk: int, actor_label: str) -> dict | None:
    """An operator's image clean-up of a host; its outcome is a host event."""
    return images.clean_up(host_pk, actor_label)


@shared_task(name="console.fleet.tasks.rotate_due_host_secrets", ignore_result=True)
def rotate_due_host_secrets() -> list[int]:
    """Queue the rotation of every host secret older than HOST_SECRET_ROTATION_DAYS."""
    due = identity.due_for_rotation()
    for pk in due:
        rotate_host_secret.delay(pk)
    return due


@shared_task(name="console.fleet.tasks.rotate_host_secret", ignore_result=True)
def rotate_host_secret(host_pk: int) -> bool:
    """The schedule's rotation of one host's secret (a failure is a host event; the next round
    tries again)."""
    return identity.rotate_scheduled(host_pk)
