"""Row locks of instances, after accounts' and before fleet's (the order: accounts/locks.py)."""

from console.instances.models import Instance


def instance(pk: int, *related: str, skip_locked: bool = False) -> Instance | None:
    """The instance's row (None when it is gone, or locked elsewhere with `skip_locked`),
    with `related` rows joined but not locked."""
    return (
        Instance.objects.select_for_update(skip_locked=skip_locked, of=("self",))
        .select_related(*related)
        .filter(pk=pk)
        .first()
    )


def instance_to_change(pk: int, *, skip_locked: bool = False) -> Instance | None:
    """The instance's row, with what a change of its state reads (spec, region, tenant)."""
    return instance(pk, "spec__mig_profile", "region", "tenant", skip_locked=skip_locked)
