"""What tenants and operators do to launch templates: save one (from fields, or from an
instance), change it, delete it, find the one a launch names, and turn it into the fields of
a launch with the caller's overrides over its own. The launch itself is the instances'
(console/instances/services.launch_instance): templates sit below instances and launch
nothing themselves."""

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from accounts.models import Tenant
from console import integers, secret_env
from console.catalog.models import REFERENCE, command_errors, env_errors, port_errors
from console.launch_templates.models import LaunchTemplate

MAX_DISK_GIB = 65536
MAX_PORTS = 16
# What a template holds and a launch may override: launch_instance's keyword arguments.
FIELDS = (
    "spec",
    "image",
    "image_ref",
    "region",
    "command",
    "env",
    "secrets",
    "ports",
    "disk_gib",
    "restart_policy",
    "on_host_loss",
    "volumes",
)


def visible(tenant: Tenant) -> QuerySet:
    """The templates a tenant's members see: their own and the published ones."""
    return LaunchTemplate.objects.filter(Q(tenant=tenant) | Q(public=True)).select_related(
        "spec", "image", "region", "tenant"
    )


def find(tenant: Tenant, ref) -> LaunchTemplate:
    """The template a launch names, by id or by name (the tenant's own before a published
    one of the same name); a field error on `template` when it sees none such."""
    templates = visible(tenant)
    pk = integers.reference_id(ref)
    ref = str(ref).strip()
    found = templates.filter(pk=pk).first() if pk is not None else None
    if found is None:
        named = templates.filter(name=ref)
        found = named.filter(tenant=tenant).first() or named.first()
    if found is None:
        names = ", ".join(templates.order_by("name").values_list("name", flat=True)[:20])
        raise ValidationError(
            {"template": f"No template {ref}. Templates: {names or '(none yet)'}."}
        )
    return found


def _check(fields: dict, secrets: dict) -> None:
    """Field errors of what a template would hold (the launch checks the rest again)."""
    errors = {}
    disk_gib, spec = fields.get("disk_gib"), fields.get("spec")
    if disk_gib is not None and spec is not None and not spec.disk_gib <= disk_gib <= MAX_DISK_GIB:
        errors["disk_gib"] = f"{spec.code} comes with {spec.disk_gib} GiB: give at least that."
    image_ref = fields.get("image_ref")
    if image_ref and fields.get("image") is not None:
        errors["image_ref"] = "Give a catalog image or an image reference, not both."
    elif image_ref and not REFERENCE.fullmatch(image_ref):
        errors["image_ref"] = "Not an image reference: registry/repository:tag, e.g. ghcr.io/x/y:1."
    command = fields.get("command")
    if command is not None and (problems := command_errors(command)):
        errors["command"] = problems
    if problems := env_errors(fields.get("env") or {}):
        errors["env"] = problems
    if problems := env_errors(secrets) or secret_env.errors(secrets, fields.get("env") or {}):
        errors["secret_env"] = problems
    ports = fields.get("ports") or []
    if problems := port_errors(ports) or (
        [f"At most {MAX_PORTS} ports."] if len(ports) > MAX_PORTS else []
    ):
        errors["ports"] = problems
    if errors:
        raise ValidationError(errors)


def _save(template: LaunchTemplate) -> LaunchTemplate:
    """Save it; a name its tenant (or the operators) already gave another is a field error."""
    template.restart_policy = template.restart_policy or ""
    taken = LaunchTemplate.objects.filter(tenant=template.tenant_id, name=template.name)
    if taken.exclude(pk=template.pk).exists():
        raise ValidationError({"name": f"A template named {template.name} already exists."})
    try:
        with transaction.atomic():
            template.save()
    except IntegrityError as exc:  # the same name, saved meanwhile
        if not taken.exclude(pk=template.pk).exists():
            raise
        raise ValidationError(
            {"name": f"A template named {template.name} already exists."}
        ) from exc
    return template


def create_template(
    tenant: Tenant | None, *, name: str, secrets: dict | None = None, actor=None, **fields
) -> LaunchTemplate:
    """Save a template of `tenant` (None: an operator's, which is public). `secrets` in clear
    (plus the env names that look like credentials) are sealed; `fields` are the other
    FIELDS and `description`."""
    env, secrets = secret_env.split(fields.pop("env", None) or {}, secrets or {})
    fields["env"] = env
    fields["image_ref"] = fields.get("image_ref") or ""
    _check(fields, secrets)
    now = timezone.now()
    template = LaunchTemplate(
        tenant=tenant,
        name=name,
        public=tenant is None,
        secret_env=secret_env.seal(secrets),
        created_by=actor if getattr(actor, "pk", None) else None,
        created_at=now,
        updated_at=now,
        **fields,
    )
    return _save(template)


def update_template(
    template: LaunchTemplate, *, secrets: dict | None = None, **fields
) -> LaunchTemplate:
    """Change the fields given. `secrets` replaces its secrets: a value that is the mask
    keeps the one it had under that name; a name left out is removed."""
    if secrets is None:
        opened = secret_env.open_all(template.secret_env)
    else:
        opened = secret_env.unmask(secrets, template.secret_env)
    env = fields.pop("env", None)
    env, opened = secret_env.split(template.env if env is None else env, opened)
    for field, value in fields.items():
        setattr(template, field, value)
    template.env = env
    template.image_ref = template.image_ref or ""
    checked = ("spec", "image", "image_ref", "command", "ports", "disk_gib")
    _check({**{field: getattr(template, field) for field in checked}, "env": env}, opened)
    template.secret_env = secret_env.seal(opened)
    template.updated_at = timezone.now()
    return _save(template)


def delete_template(template: LaunchTemplate) -> None:
    template.delete()


def save_from_instance(instance, name: str, *, actor=None) -> LaunchTemplate:
    """A template of an instance's tenant that launches what `instance` was launched with:
    its spec, image, region, command, env and secrets (still sealed), ports, disk, restart
    policy, what it does when its host is lost, and the volumes attached to it (by name)."""
    now = timezone.now()
    template = LaunchTemplate(
        tenant_id=instance.tenant_id,
        name=name,
        spec_id=instance.spec_id,
        image_id=instance.image_id,
        image_ref=instance.image_reference,
        region_id=instance.region_id,
        command=instance.command,
        env=instance.env,
        secret_env=instance.secret_env,
        ports=instance.ports,
        disk_gib=instance.disk_gib,
        restart_policy=instance.restart_policy,
        on_host_loss=instance.on_host_loss,
        volumes=[
            {"volume": volume.name, "mount_path": volume.mount_path}
            for volume in instance.volumes.filter(deleted_at__isnull=True).order_by("name")
        ],
        created_by=actor if getattr(actor, "pk", None) else None,
        created_at=now,
        updated_at=now,
    )
    return _save(template)


def launch_fields(template: LaunchTemplate, given: dict) -> dict:
    """The launch_instance keyword arguments of a launch from `template`: its own fields,
    each replaced by the one `given` (not None), but env and secrets, which are laid over its
    own by name (a secret given as the mask keeps the template's)."""
    fields = {
        "spec": template.spec,
        "image": template.image,
        "image_ref": template.image_ref or None,
        "region": template.region,
        "command": template.command,
        "env": template.env,
        "secrets": secret_env.open_all(template.secret_env),
        "ports": template.ports or None,
        "disk_gib": template.disk_gib,
        "restart_policy": template.restart_policy or None,
        "on_host_loss": template.on_host_loss,
        "volumes": template.volumes or None,
    }
    given = {field: value for field, value in given.items() if value is not None}
    if given.get("image") is not None or given.get("image_ref"):  # the launch's image wins
        fields["image"] = fields["image_ref"] = None
    env = {**fields["env"], **given.pop("env", {})}
    secrets = {
        **fields["secrets"],
        **secret_env.unmask(given.pop("secrets", {}), template.secret_env),
    }
    return {**fields, **given, "env": env, "secrets": secrets}
