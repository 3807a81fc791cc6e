"""The models whose rows are their own record: each save or delete of one, made while a
person acts (the admin, a console page, the API), writes an entry with the fields it
changed, inside the save's transaction. Changes the system makes (agents' heartbeats,
Celery, beat) write none, nor do bulk ``update()`` calls: what they change is recorded by
the action function that made them, if anyone asked for it.

``<model>.create``, ``<model>.update``, ``<model>.delete`` name the action, or the verb of
VERBS when the change sets that field (an ApiToken's ``revoked_at``: ``apitoken.revoke``)."""

from django.apps import apps
from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_save

from console.audit import context, recorder

# app_label.Model: fields never written to the log (secrets; what only machines change)
CAPTURED: dict[str, frozenset[str]] = {
    "accounts.Tenant": frozenset(),
    "accounts.Quota": frozenset(),
    "accounts.Membership": frozenset(),
    "accounts.Invitation": frozenset({"token_hash"}),
    "accounts.ApiToken": frozenset({"token_hash", "last_used_at"}),
    "accounts.SshKey": frozenset({"public_key"}),
    "catalog.Region": frozenset(),
    "catalog.GpuModel": frozenset(),
    "catalog.MigProfile": frozenset(),
    "catalog.Spec": frozenset(),
    "catalog.SpecPrice": frozenset(),
    "catalog.Image": frozenset(),
    "fleet.Host": frozenset(
        {"last_heartbeat_at", "inventory_digest", "status_changed_at", "unreachable_since"}
    ),
    "fleet.Gpu": frozenset({"mig_devices", "health_changed_at"}),
    "fleet.JoinToken": frozenset({"token_hash"}),
    "launch_templates.LaunchTemplate": frozenset(),
    "registry_credentials.RegistryCredential": frozenset({"sealed_secret", "last_used_at"}),
    "idle.OperatorPolicy": frozenset(),
    "idle.TenantPolicy": frozenset(),
    "idle.InstancePolicy": frozenset(),
    # a Slack hook's address is itself a credential
    "notifications.Endpoint": frozenset({"target", "previous_secret_expires_at"}),
}

# a field that, once set by a change, names its action
VERBS = {"revoked_at": "revoke", "accepted_at": "accept", "used_at": "use"}

_SECRET_NAMES = ("hash", "secret", "password")
# every field some model keeps out of the log: a payload's field of that name is kept out too
_HIDDEN_NAMES = frozenset().union(*CAPTURED.values())


def is_secret(name: str) -> bool:
    """A field (of a model, or of a request's body) whose value the log never shows."""
    name = name.lower()
    return name in _HIDDEN_NAMES or any(word in name for word in _SECRET_NAMES)


def _fields(model, only=None) -> list[str]:
    """The columns (attnames) of `model` the log shows: of `only` (field names) if given."""
    hidden = CAPTURED[model._meta.label]
    return [
        field.attname
        for field in model._meta.concrete_fields
        if not field.primary_key
        and field.name not in hidden
        and not any(word in field.name for word in _SECRET_NAMES)
        and (only is None or field.name in only)
    ]


def _tenant_id(obj):
    if obj._meta.label == "accounts.Tenant":
        return obj.pk
    if obj._meta.label == "accounts.SshKey":
        return obj.membership.tenant_id
    if obj._meta.label == "idle.InstancePolicy":
        return obj.instance.tenant_id
    return getattr(obj, "tenant_id", None)


def _stored(sender, obj, fields) -> dict:
    return sender._base_manager.filter(pk=obj.pk).values(*fields).first() or {}


def _before_save(sender, instance, raw=False, update_fields=None, **kwargs):
    if raw or instance.pk is None or not context.current().is_person:
        return
    fields = _fields(sender, update_fields)
    instance._audit_before = (fields, _stored(sender, instance, fields))


def _after_save(sender, instance, created, raw=False, **kwargs):
    actor = context.current()
    if raw or not actor.is_person:
        return
    fields, before = instance.__dict__.pop("_audit_before", (_fields(sender), {}))
    after = {name: getattr(instance, name) for name in fields}
    before, after = recorder.changed(before, after)
    if not created and not after:
        return  # saved as it was
    verb = "create" if created else _verb(before, after)
    _write(sender, instance, verb, before, after, actor)


def _verb(before: dict, after: dict) -> str:
    for field, verb in VERBS.items():
        if after.get(field) is not None and before.get(field) is None:
            return verb
    return "update"


def _after_delete(sender, instance, **kwargs):
    actor = context.current()
    if not actor.is_person:
        return
    before = {name: getattr(instance, name) for name in _fields(sender)}
    _write(sender, instance, "delete", before, {}, actor)


def _write(sender, instance, verb, before, after, actor) -> None:
    # in the save's transaction (the admin's and the services' saves run in one); a save
    # made outside any has already been committed, and its entry follows it at once
    with transaction.atomic():
        recorder.record(
            f"{sender._meta.model_name}.{verb}",
            instance,
            tenant=_tenant_id(instance),
            before=before,
            after=after,
            actor=actor,
        )


def connect() -> None:
    for label in CAPTURED:
        model = apps.get_model(label)
        uid = f"audit-{label}"
        pre_save.connect(_before_save, sender=model, dispatch_uid=uid)
        post_save.connect(_after_save, sender=model, dispatch_uid=uid)
        post_delete.connect(_after_delete, sender=model, dispatch_uid=uid)
