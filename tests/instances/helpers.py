from django.utils import timezone

from console.instances.models import Instance, InstanceEvent


def make_instance(catalog, tenant, *, state="pending", spec=None, name=None, when=None, **extra):
    """A new instance of `catalog` (its quarter spec, image and region unless told) with its
    first event, made `when` (default: now)."""
    now = when or timezone.now()
    instance = Instance.objects.create(
        tenant=tenant,
        name=name or f"box-{Instance.objects.count() + 1}",
        spec=spec or catalog.quarter,
        image=catalog.image,
        region=catalog.region,
        state=state,
        created_at=now,
        updated_at=now,
        **extra,
    )
    InstanceEvent.objects.create(instance=instance, at=now, actor_label="system", to_state=state)
    return instance


def states(instance) -> list[str]:
    return list(instance.events.order_by("at", "pk").values_list("to_state", flat=True))
