"""A tenant's credentials for a private image registry: a username and a token (or password)
per registry host[:port]. The token is sealed as secret env is (console/secret_env.py) and
opened only into the agent's request of an allocation that pulls from that registry
(services.pull_auth); nobody is ever shown it again."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from accounts.models import Tenant


class RegistryCredential(models.Model):
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="registry_credentials"
    )
    registry = models.CharField(max_length=255, help_text="host[:port], e.g. ghcr.io")
    username = models.CharField(max_length=255)
    # the token or password, sealed (secret_env.seal): the audit log never writes this field
    sealed_secret = models.TextField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["registry"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "registry"], name="one_registry_credential_per_tenant"
            )
        ]

    def __str__(self) -> str:
        return f"{self.registry} ({self.username})"
