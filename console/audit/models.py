from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone

SYSTEM = "system"
DONE, REFUSED = "done", "refused"


class AuditEntry(models.Model):
    """One change, or one refused attempt at one (with its error code), written once and never
    changed. The tenant, user and token are kept as
    ids without a database constraint and with their names beside them: the log outlives
    what it names."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    tenant = models.ForeignKey(
        "accounts.Tenant",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
        help_text="whose thing changed; none for operators' own (catalog, hosts)",
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
    )
    token = models.ForeignKey(
        "accounts.ApiToken",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
        help_text="the API token the user acted with, if any",
    )
    actor = models.CharField(
        max_length=200, help_text="the username (with its token's name and prefix), or 'system'"
    )
    action = models.CharField(max_length=64, db_index=True, help_text="e.g. instance.launch")
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    before = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    after = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    address = models.GenericIPAddressField(null=True, blank=True)
    error_code = models.CharField(
        max_length=64,
        blank=True,
        help_text="a refused action's error code (ErrorCode); empty: it was done",
    )
    error_message = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-at", "-pk"]
        verbose_name_plural = "audit entries"
        indexes = [
            models.Index(fields=["tenant", "-at"], name="audit_tenant_at"),
            models.Index(fields=["object_type", "object_id"], name="audit_object"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.object_type} {self.object_repr}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise PermissionDenied("Audit entries are never changed.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise PermissionDenied("Audit entries are never deleted.")

    @property
    def outcome(self) -> str:
        return REFUSED if self.error_code else DONE

    @property
    def by_system(self) -> bool:
        return self.actor == SYSTEM

    @property
    def changes(self) -> list[tuple[str, object, object]]:
        """(field, before, after) for each changed field; None where it had or has none."""
        names = [*self.after, *(name for name in self.before if name not in self.after)]
        return [(name, self.before.get(name), self.after.get(name)) for name in names]
