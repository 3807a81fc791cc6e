"""snapshots 0003 (the store split per tenant): every snapshot taken before it is in the shared
repository, and stays readable there; every snapshot after it goes to its tenant's own."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from console.snapshots import store as stores
from console.snapshots.models import Snapshot
from tests.factories import RegionFactory, TenantFactory

BEFORE = [("snapshots", "0002_volume_snapshots")]
AFTER = [("snapshots", "0003_tenant_stores")]


@pytest.mark.slow  # migrating back and forth takes seconds
@pytest.mark.django_db(transaction=True)
def test_the_snapshots_taken_before_stay_in_the_shared_store(settings):
    settings.SNAPSHOT_REPOSITORY, settings.SNAPSHOT_PASSWORD = "/srv/snapshots", "old-password"
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    tenant, region = TenantFactory(), RegionFactory()  # apps the migration leaves as they are
    for state in ("done", "running"):
        old.get_model("snapshots", "Snapshot").objects.create(
            tenant_id=tenant.pk, region_id=region.pk, source_name="data", disk_name="gpucloud-x",
            size_gib=1, state=state, restic_id="ab" * 32,
        )  # fmt: skip
    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    before = list(Snapshot.objects.all())
    assert [s.store for s in before] == [Snapshot.Store.LEGACY] * 2
    shared = {"repository": "/srv/snapshots", "password": "old-password"}
    assert all(stores.for_snapshot(s) == shared for s in before)
    after = Snapshot.objects.create(
        tenant_id=tenant.pk, region_id=region.pk, source_name="data", disk_name="gpucloud-x",
        size_gib=1,
    )  # fmt: skip
    assert after.store == Snapshot.Store.TENANT
    assert stores.for_snapshot(after)["repository"].startswith("/srv/snapshots/tenants/")
