"""The snapshot store: one restic repository and one password per tenant, so that a host
running one tenant's job learns nothing that opens another tenant's snapshots, and restic's
deduplication never crosses tenants.

A tenant's repository is SNAPSHOT_REPOSITORY with `tenants/<key>` added (its TenantStore's
key: a random UUID, never changed, never reused); its password is derived from
SNAPSHOT_MASTER_SECRET with HKDF-SHA256, the key in the context. The master never leaves the
console. Snapshots taken before the split (`Snapshot.Store.LEGACY`) stay in the shared
repository, SNAPSHOT_REPOSITORY itself, opened by SNAPSHOT_PASSWORD."""

import base64
import uuid

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from console.snapshots.models import Snapshot, TenantStore

TENANTS = "tenants"
# restic's `scheme:container:path` forms: the container is followed by a colon, then the
# path (swift needs it to start with a slash; the others take one)
CONTAINER_SCHEMES = ("b2:", "azure:", "gs:", "swift:")
CONTEXT = b"gpucloud snapshot store v1, the repository password of tenant store "


class StoreUnavailable(Exception):
    """A snapshot's repository cannot be opened with what this console holds."""


def tenant_repository(base: str, key: uuid.UUID) -> str:
    """The repository named `tenants/<key>` under the restic repository string `base`, in
    each of its forms: a folder under a local path (`/srv/snapshots`, `local:…`), an SFTP path
    (`sftp:user@host:/srv/x`, `sftp:user@host:` for its home, `sftp://user@host:22//srv/x`),
    a REST server (`rest:https://host:8000/`); a prefix in an S3 bucket
    (`s3:https://host/bucket[/prefix]`), a B2, Azure, GCS or Swift container
    (`b2:bucket[:prefix]`, `azure:container:/prefix`, …) and an rclone remote
    (`rclone:remote:path`)."""
    if base.startswith(CONTAINER_SCHEMES) and base.count(":") == 1:
        base += ":/"  # a container named with no path: its root
    joint = "" if base.endswith(("/", ":")) else "/"
    return f"{base}{joint}{TENANTS}/{key}"


def tenant_password(master: str, key: uuid.UUID) -> str:
    """The password of the tenant store `key`: HKDF-SHA256 of the master secret, in the
    context of that key (32 bytes, URL-safe base64). Refused without a master: a process
    that did not make its state directory (console.state_dir.prepare) holds none."""
    if not master:
        raise ImproperlyConfigured("SNAPSHOT_MASTER_SECRET is neither set nor made in var/.")
    derived = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=CONTEXT + str(key).encode()
    ).derive(master.encode())
    return base64.urlsafe_b64encode(derived).decode().rstrip("=")


def tenant_key(tenant_id: int) -> uuid.UUID:
    """The tenant's store key, made on its first snapshot."""
    return TenantStore.objects.get_or_create(tenant_id=tenant_id)[0].key


def for_snapshot(snapshot: Snapshot) -> dict:
    """The store a job on the snapshot carries (its backup, its restores, its forget): its
    tenant's repository and password, or the shared repository's for one taken before the
    split. Never shown to a tenant, never logged."""
    if snapshot.store == Snapshot.Store.LEGACY:
        if not settings.SNAPSHOT_PASSWORD:
            raise StoreUnavailable(
                "this snapshot is in the shared store of before the split, whose password "
                "(SNAPSHOT_PASSWORD) this console does not hold"
            )
        return {"repository": settings.SNAPSHOT_REPOSITORY, "password": settings.SNAPSHOT_PASSWORD}
    key = tenant_key(snapshot.tenant_id)
    return {
        "repository": tenant_repository(settings.SNAPSHOT_REPOSITORY, key),
        "password": tenant_password(settings.SNAPSHOT_MASTER_SECRET, key),
    }
