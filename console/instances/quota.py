"""What a tenant's instances take from its quota."""

from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Count, Q

from accounts.models import Tenant
from console.catalog.models import Spec
from console.instances.models import Instance, State

# States whose instances hold (or are about to hold) GPU capacity.
COUNTED_STATES = (
    State.PENDING,
    State.PROVISIONING,
    State.RUNNING,
    State.UNREACHABLE,
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
    """Counted per spec: a launch reads this under the tenant's quota lock (on SQLite, the
    database's write lock), so it stays two small queries however many instances there are."""
    instances = counted(Instance.objects.filter(tenant=tenant))
    if exclude_instance_id is not None:
        instances = instances.exclude(pk=exclude_instance_id)
    per_spec = dict(instances.order_by().values_list("spec_id").annotate(n=Count("pk")))
    specs = Spec.objects.filter(pk__in=per_spec).select_related("mig_profile") if per_spec else []
    gpu_used = sum((spec.gpu_equivalents * per_spec[spec.pk] for spec in specs), Decimal("0"))
    return QuotaUsage(gpu_used=gpu_used, instances_used=sum(per_spec.values()))
