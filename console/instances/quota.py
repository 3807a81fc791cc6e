"""What a tenant's instances take from its quota."""

from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Q

from accounts.models import Tenant
from console.instances.models import Instance, State

# States whose instances hold (or are about to hold) GPU capacity.
COUNTED_STATES = (
    State.PENDING,
    State.PROVISIONING,
    State.RUNNING,
    State.STARTING,
    State.REBOOTING,
)


@dataclass(frozen=True)
class QuotaUsage:
    gpu_used: Decimal
    instances_used: int


def counted(queryset):
    """The instances of `queryset` that take quota: those in COUNTED_STATES, and those that a
    resize is stopping only to start them again (their quota stays reserved)."""
    return queryset.filter(
        Q(state__in=COUNTED_STATES) | Q(state=State.STOPPING, resume_after_stop=True)
    )


def usage(tenant: Tenant, exclude_instance_id: int | None = None) -> QuotaUsage:
    instances = counted(Instance.objects.filter(tenant=tenant)).select_related("spec__mig_profile")
    if exclude_instance_id is not None:
        instances = instances.exclude(pk=exclude_instance_id)
    instances = list(instances)
    gpu_used = sum((i.spec.gpu_equivalents for i in instances), Decimal("0"))
    return QuotaUsage(gpu_used=gpu_used, instances_used=len(instances))
