"""What a tenant does with its registry credentials (add or replace, remove) and the one
place that opens one: `pull_auth`, for the agent's request of an allocation whose image is in
that registry. The secret is never returned, logged, audited or put in an event."""

import logging
import re

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import Tenant
from console import secret_env
from console.catalog import registries
from console.registry_credentials.models import RegistryCredential

log = logging.getLogger(__name__)

REGISTRY = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,252})(?::[0-9]{1,5})?")
USERNAME = re.compile(r"[^\s\x00-\x1f\x7f]{1,255}")
MAX_SECRET = 4096


def _check(registry: str, username: str, secret: str) -> None:
    errors = {}
    if not isinstance(registry, str) or not REGISTRY.fullmatch(registry):
        errors["registry"] = "A registry's host[:port] in lower case, e.g. ghcr.io (no scheme)."
    elif registry == "localhost":
        errors["registry"] = "localhost names the hosts themselves, not a registry."
    if not isinstance(username, str) or not USERNAME.fullmatch(username):
        errors["username"] = "1 to 255 characters, no spaces."
    if not isinstance(secret, str) or not secret or len(secret) > MAX_SECRET:
        errors["password"] = f"The token or password: 1 to {MAX_SECRET} characters."
    elif any(ch in secret for ch in "\r\n\x00"):
        errors["password"] = "The token or password is one line."  # noqa: S105 (a message)
    if errors:
        raise ValidationError(errors)


def save_credential(
    tenant: Tenant, *, registry: str, username: str, password: str, actor=None
) -> RegistryCredential:
    """Store the tenant's credential for `registry`, replacing the one it had there."""
    registry = (registry or "").strip().lower()
    _check(registry, username, password)
    sealed = secret_env.seal({"secret": password})["secret"]
    now = timezone.now()
    with transaction.atomic():
        RegistryCredential.objects.filter(tenant=tenant, registry=registry).delete()
        try:
            with transaction.atomic():
                credential = RegistryCredential.objects.create(
                    tenant=tenant,
                    registry=registry,
                    username=username,
                    sealed_secret=sealed,
                    created_by=actor if getattr(actor, "pk", None) else None,
                    created_at=now,
                )
        except IntegrityError as exc:  # the same registry, saved meanwhile
            raise ValidationError(
                {"registry": f"A credential for {registry} was saved meanwhile: try again."}
            ) from exc
    return credential


def remove_credential(credential: RegistryCredential) -> None:
    credential.delete()


def pull_auth(tenant_id: int | None, reference: str) -> dict | None:
    """{registry, username, password} for the agent's pull of `reference`, when the tenant
    holds a credential for its registry (None otherwise, and for a job of no tenant); its
    last use is noted."""
    registry = registries.registry_of(reference)
    if not registry or tenant_id is None:
        return None
    credential = RegistryCredential.objects.filter(tenant_id=tenant_id, registry=registry).first()
    if credential is None:
        return None
    RegistryCredential.objects.filter(pk=credential.pk).update(last_used_at=timezone.now())
    password = secret_env.open_all({"secret": credential.sealed_secret})["secret"]
    return {"registry": registry, "username": credential.username, "password": password}
