"""The snapshot store's rules (console/snapshots/store.py): a tenant's repository under the
operator's, in each form restic takes, and its password derived from the master secret."""

import uuid

import pytest
from django.core.exceptions import ImproperlyConfigured

from console import settings as console_settings
from console import state_dir
from console.snapshots import store as stores

KEY = uuid.UUID("0b6f2c3e-8d1a-4c55-9e2f-7a1b2c3d4e5f")
MASTER = "a-master-secret-of-at-least-32-characters"


@pytest.mark.parametrize(
    ("base", "repository"),
    [
        ("/srv/snapshots", f"/srv/snapshots/tenants/{KEY}"),
        ("/srv/snapshots/", f"/srv/snapshots/tenants/{KEY}"),
        ("/", f"/tenants/{KEY}"),
        ("var/snapshots", f"var/snapshots/tenants/{KEY}"),
        ("local:/srv/snapshots", f"local:/srv/snapshots/tenants/{KEY}"),
        ("sftp:backup@store:/srv/gpucloud", f"sftp:backup@store:/srv/gpucloud/tenants/{KEY}"),
        ("sftp:backup@store:", f"sftp:backup@store:tenants/{KEY}"),  # in its home, as the base
        ("sftp:backup@store:/", f"sftp:backup@store:/tenants/{KEY}"),
        ("sftp://backup@store:2222//srv/x", f"sftp://backup@store:2222//srv/x/tenants/{KEY}"),
        ("s3:https://s3.example.com/bucket", f"s3:https://s3.example.com/bucket/tenants/{KEY}"),
        ("s3:https://s3.example.com/bucket/gpc", f"s3:https://s3.example.com/bucket/gpc/tenants/{KEY}"),
        ("s3:s3.amazonaws.com/bucket/", f"s3:s3.amazonaws.com/bucket/tenants/{KEY}"),
        ("rest:https://u:p@store:8000/", f"rest:https://u:p@store:8000/tenants/{KEY}"),
        ("rest:https://u:p@store:8000/gpc", f"rest:https://u:p@store:8000/gpc/tenants/{KEY}"),
        ("b2:bucket", f"b2:bucket:/tenants/{KEY}"),
        ("b2:bucket:gpc", f"b2:bucket:gpc/tenants/{KEY}"),
        ("azure:container", f"azure:container:/tenants/{KEY}"),
        ("azure:container:/gpc", f"azure:container:/gpc/tenants/{KEY}"),
        ("gs:bucket:/", f"gs:bucket:/tenants/{KEY}"),
        ("gs:bucket", f"gs:bucket:/tenants/{KEY}"),
        ("swift:container:/gpc", f"swift:container:/gpc/tenants/{KEY}"),
        ("swift:container", f"swift:container:/tenants/{KEY}"),
        ("rclone:remote:gpc", f"rclone:remote:gpc/tenants/{KEY}"),
        ("rclone:remote:", f"rclone:remote:tenants/{KEY}"),
    ],
)  # fmt: skip
def test_a_tenants_repository_lies_under_the_operators_in_each_form(base, repository):
    assert stores.tenant_repository(base, KEY) == repository


def test_each_tenant_has_a_repository_of_its_own():
    other = uuid.uuid4()
    assert stores.tenant_repository("/srv/s", KEY) != stores.tenant_repository("/srv/s", other)


def test_a_tenants_password_is_derived_from_the_master_with_its_key():
    password = stores.tenant_password(MASTER, KEY)
    assert password == stores.tenant_password(MASTER, KEY)  # deterministic
    assert len(password) == 43 and MASTER not in password
    assert password != stores.tenant_password(MASTER, uuid.uuid4())  # per tenant
    assert password != stores.tenant_password(MASTER + "x", KEY)  # per master
    assert password != MASTER
    with pytest.raises(ImproperlyConfigured, match="SNAPSHOT_MASTER_SECRET"):
        stores.tenant_password("", KEY)  # a process that made no state directory


def test_the_master_secret_is_checked(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUCLOUD_VAR_DIR", str(tmp_path))
    monkeypatch.delenv("SNAPSHOT_MASTER_SECRET", raising=False)
    monkeypatch.delenv("SNAPSHOT_PASSWORD", raising=False)
    assert console_settings._snapshot_master_secret("") == ""  # none made yet
    state_dir.prepare()
    made = console_settings._snapshot_master_secret("")
    state_dir.prepare()
    assert made == console_settings._snapshot_master_secret("")  # generated once, then read
    assert len(made) >= 32
    assert (tmp_path / "snapshot-master-secret").stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("SNAPSHOT_PASSWORD", "the-old-shared-password")
    with pytest.raises(ImproperlyConfigured, match="SNAPSHOT_MASTER_SECRET is not"):
        console_settings._snapshot_master_secret("the-old-shared-password")
    monkeypatch.setenv("SNAPSHOT_MASTER_SECRET", "short")
    with pytest.raises(ImproperlyConfigured, match="at least 32"):
        console_settings._snapshot_master_secret("")
    monkeypatch.setenv("SNAPSHOT_MASTER_SECRET", MASTER)
    with pytest.raises(ImproperlyConfigured, match="a new secret"):
        console_settings._snapshot_master_secret(MASTER)
    assert console_settings._snapshot_master_secret("the-old-shared-password") == MASTER
