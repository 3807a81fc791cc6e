"""A suspended tenant runs nothing: every instance of it that runs or is on its way to run
(placed, pulling its image, rebooting) is stopped, its queued ones stop waiting, a resize
under way does not start it again, and none of them starts until the tenant is reactivated.
Disks stay. (An agent that reports one running after all is answered with a stop:
outcomes.mark_running.)"""

import logging

from django.db import transaction
from django.dispatch import receiver

from accounts.models import Tenant
from accounts.signals import tenant_suspended
from console.instances import lifecycle, locks, queue, services
from console.instances.models import Instance, State

log = logging.getLogger(__name__)

S = State
MESSAGE = "Stopped: its tenant is suspended"
# What a suspension stops: all but what is stopped, failed or on its way out.
STOPPABLE = frozenset(State.values) - {S.STOPPED, S.FAILED, S.TERMINATING, S.TERMINATED}


def stop_suspended_tenant(tenant: Tenant) -> int:
    """Stop every instance of a suspended tenant that runs, is on its way to run or waits in
    the queue; answers how many."""
    return services.stop_all(tenant, STOPPABLE, lambda instance: stop_for_suspension(instance.pk))


def stop_for_suspension(instance_pk: int) -> bool:
    """Queued: stopped. Running or on its way (provisioning, starting, rebooting): stopping,
    and the agent is asked to stop it. Stopping for a resize: it stays stopped. Answers
    whether it changed anything."""
    with transaction.atomic():
        instance = locks.instance_to_change(instance_pk)
        if instance is None:
            return False
        resumed = instance.resume_after_stop
        if resumed:
            instance.resume_after_stop = False
            Instance.objects.filter(pk=instance.pk).update(resume_after_stop=False)
        if instance.state == S.PENDING:
            lifecycle.transition(instance, S.STOPPED, message=f"{MESSAGE} (was queued)")
        elif lifecycle.can(instance.state, S.STOPPING):
            lifecycle.transition(instance, S.STOPPING, message=MESSAGE)
            queue.enqueue("stop", instance.pk)
        else:
            return resumed
    log.info("instance %s stopped: its tenant is suspended", instance_pk)
    return True


@receiver(tenant_suspended)
def _on_suspension(sender, tenant, **kwargs):
    stop_suspended_tenant(tenant)
