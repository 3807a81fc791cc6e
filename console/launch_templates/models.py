"""Launch templates: a saved launch (image, command, env and secrets, ports, spec, disk,
restart policy) that a tenant launches again in one click. A tenant's own templates are its
members'; a public one (operators publish it, in the admin) every tenant sees."""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from accounts.models import Tenant
from console import secret_env
from console.catalog.models import (
    Image,
    Region,
    RestartPolicy,
    Spec,
    command_errors,
    env_errors,
    port_errors,
)

# as console.instances.models.OnHostLoss, which this layer (below the instances) cannot import
ON_HOST_LOSS = [
    ("keep_disk", "Keep its disk (wait for the host)"),
    ("fresh_disk", "Run again elsewhere on a fresh disk"),
]


class LaunchTemplate(models.Model):
    # None: an operator's own template, which is public
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="launch_templates"
    )
    name = models.CharField(max_length=80)
    description = models.CharField(max_length=300, blank=True)
    public = models.BooleanField(
        default=False, help_text="every tenant sees it and launches from it (operators only)"
    )
    spec = models.ForeignKey(Spec, on_delete=models.PROTECT, related_name="+")
    image = models.ForeignKey(
        Image, on_delete=models.PROTECT, null=True, blank=True, related_name="+",
        help_text="empty: the default image at launch",
    )  # fmt: skip
    # a tenant's own image reference instead of a catalog image (the region's rules apply
    # at launch: catalog/registries.py)
    image_ref = models.CharField(
        max_length=255, blank=True, help_text="an image reference of the tenant's own, or empty"
    )
    region = models.ForeignKey(
        Region, on_delete=models.PROTECT, null=True, blank=True, related_name="+",
        help_text="empty: where the spec fits at launch",
    )  # fmt: skip
    command = models.JSONField(null=True, blank=True)
    env = models.JSONField(default=dict, blank=True)
    # sealed ({NAME: token}, secret_env.seal), as an instance keeps its own
    secret_env = models.JSONField(default=dict, blank=True)
    ports = models.JSONField(default=list, blank=True)
    # the tenant's volumes to attach, by name: [{"volume": "data", "mount_path": "/data"}]
    volumes = models.JSONField(default=list, blank=True)
    disk_gib = models.PositiveIntegerField(null=True, blank=True, help_text="empty: the spec's")
    restart_policy = models.CharField(
        max_length=12, choices=RestartPolicy.choices, blank=True,
        help_text="empty: the image's",
    )  # fmt: skip
    on_host_loss = models.CharField(max_length=12, choices=ON_HOST_LOSS, default="keep_disk")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
        related_name="+",
    )  # fmt: skip
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "pk"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="one_template_name_per_tenant"),
            models.UniqueConstraint(
                fields=["name"], condition=Q(tenant__isnull=True), name="one_operator_template_name"
            ),
            models.CheckConstraint(
                condition=Q(tenant__isnull=False) | Q(public=True),
                name="operator_templates_are_public",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self):
        """What the admin's form checks (the services check the rest)."""
        errors = {}
        if self.tenant_id is None and not self.public:
            errors["public"] = "A template of no tenant is an operator's: it must be public."
        if problems := env_errors(self.env):
            errors["env"] = problems
        if self.command is not None and (problems := command_errors(self.command)):
            errors["command"] = problems
        if problems := port_errors(self.ports):
            errors["ports"] = problems
        if errors:
            raise ValidationError(errors)

    @property
    def masked_secrets(self) -> dict[str, str]:
        return secret_env.masked(self.secret_env)
