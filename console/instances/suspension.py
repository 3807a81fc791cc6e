"""A suspended tenant runs nothing: its running (and queued) instances are stopped, keeping
their disks, and none of them starts until the tenant is reactivated."""

import logging

from django.dispatch import receiver

from accounts.models import Tenant
from accounts.signals import tenant_suspended
from console.errors import DomainError
from console.instances import services
from console.instances.models import Instance, State

log = logging.getLogger(__name__)

STOPPED_ON_SUSPENSION = (State.RUNNING, State.PENDING)


def stop_suspended_tenant(tenant: Tenant) -> int:
    """Stop every running or queued instance of a suspended tenant; answers how many."""
    stopped = 0
    instances = Instance.objects.filter(tenant=tenant, state__in=STOPPED_ON_SUSPENSION)
    for instance in instances.order_by("pk"):
        try:
            services.stop_instance(instance, actor=None)
        except DomainError as error:
            log.info("suspension stop of instance %s skipped: %s", instance.pk, error)
            continue
        stopped += 1
    return stopped


@receiver(tenant_suspended)
def _on_suspension(sender, tenant, **kwargs):
    stop_suspended_tenant(tenant)
