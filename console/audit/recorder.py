"""Writing audit entries. ``record`` is the one way in: action functions call it inside the
transaction of their change, so that a change rolled back leaves no entry:

    with transaction.atomic():
        before = recorder.snapshot(volume, ["size_gib"])
        ...change the volume...
        recorder.record("volume.resize", volume, before=before, after={"size_gib": 200})

The actor (user, token, client address) is whoever acts now (console.audit.context).

A refused action has no change to share a transaction with: ``record_refusal`` writes its
entry on its own, with the refusal's error code (console.audit.refusals)."""

from django.db import transaction

from console.audit import context
from console.audit.models import AuditEntry


class OutsideTransaction(RuntimeError):
    """An entry written outside its change's transaction could outlive a rolled-back change."""


def snapshot(obj, fields) -> dict:
    """The values of `fields` (names; a foreign key gives its id) of `obj`, as stored."""
    values = {}
    for name in fields:
        field = obj._meta.get_field(name)
        values[name] = field.value_from_object(obj)
    return values


def changed(before: dict, after: dict) -> tuple[dict, dict]:
    """Only what differs: (before, after) restricted to the keys whose value changed."""
    keys = [key for key in after if before.get(key) != after[key]]
    keys += [key for key in before if key not in after]
    return {k: before[k] for k in keys if k in before}, {k: after[k] for k in keys if k in after}


def entry(
    action: str,
    obj,
    *,
    tenant=None,
    before: dict | None = None,
    after: dict | None = None,
    object_type: str | None = None,
    actor: context.Actor | None = None,
) -> AuditEntry:
    """The (unsaved) entry of `action` (``<object type>.<verb>``) done to `obj` (a model
    instance) in `tenant` (default: the object's own ``tenant_id``), with the fields it
    changed."""
    actor = actor or context.current()
    tenant_id = getattr(obj, "tenant_id", None) if tenant is None else getattr(tenant, "pk", tenant)
    before, after = changed(before or {}, after or {})
    return AuditEntry(
        tenant_id=tenant_id,
        user=actor.user,
        token=actor.token,
        actor=actor.label[:200],
        action=action,
        object_type=object_type or obj._meta.model_name,
        object_id=str(obj.pk) if obj.pk is not None else "",
        object_repr=str(obj)[:200],
        before=before,
        after=after,
        address=actor.address,
    )


def _inside(action: str) -> None:
    if not transaction.get_connection().in_atomic_block:
        raise OutsideTransaction(f"{action} must be recorded inside its change's transaction.")


def record(action: str, obj, **details) -> AuditEntry:
    """One entry (``entry``'s arguments), written now, in the change's transaction."""
    _inside(action)
    made = entry(action, obj, **details)
    made.save()
    return made


def record_all(entries: list[AuditEntry]) -> None:
    """Entries of one change to many objects (``entry``), written in one statement."""
    for made in entries:
        _inside(made.action)
    AuditEntry.objects.bulk_create(entries)


def record_refusal(
    action: str,
    *,
    tenant_id: int | None,
    object_type: str,
    object_id: str,
    asked: dict,
    code: str,
    message: str,
) -> AuditEntry | None:
    """The entry of `action` refused with `code` to the person acting now (none for the
    system), with what it `asked` (secrets already masked), committed on its own."""
    actor = context.current()
    if not actor.is_person:
        return None
    with transaction.atomic():
        return AuditEntry.objects.create(
            tenant_id=tenant_id,
            user=actor.user,
            token=actor.token,
            actor=actor.label[:200],
            action=action[:64],
            object_type=object_type[:64],
            object_id=object_id[:64],
            after=asked,
            address=actor.address,
            error_code=code[:64],
            error_message=message[:500],
        )
