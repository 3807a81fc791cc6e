"""Celery tasks of volumes: a deleted volume's disk leaves its host."""

from celery import shared_task
from django.conf import settings

from console.fleet import agent_client
from console.fleet.agent_client import RETRIED_WHILE_UNAVAILABLE, AgentRejected
from console.fleet.models import Host
from console.volumes import services


@shared_task(
    bind=True,
    name="console.volumes.tasks.remove_disk",
    **RETRIED_WHILE_UNAVAILABLE,
    reject_on_worker_lost=True,
)
def remove_disk(self, volume_pk: int) -> bool:
    """Remove a deleted volume's disk from its host (idempotent: gone already, nothing). A
    retired host keeps it: there is nobody to ask. While the container of the instance it
    was detached from (at that instance's terminate) still mounts it, the agent refuses
    (409 volume_busy): later, then."""
    volume = services.disk_to_remove(volume_pk)
    if volume is None or volume.host.status == Host.Status.RETIRED:
        return False
    try:
        agent_client.delete_volume(volume.host, volume.disk_name, volume.owner, volume.tenant_id)
    except AgentRejected as exc:
        if exc.status != 409 or exc.code != "volume_busy":
            raise
        raise self.retry(exc=exc, countdown=settings.INSTANCE_AGENT_RETRY_BACKOFF) from exc
    services.disk_removed(volume_pk)
    return True
