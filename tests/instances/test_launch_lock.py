"""A launch holds the write transaction (on SQLite the database's one write lock, which every
other launch, task and agent event waits for) only for what must be decided together with the
other launches: a fixed number of statements, however many instances the tenant has; the
request's own checks, the region and its hardware are read before it."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.catalog.models import Mode
from console.instances import services
from console.instances.models import State

pytestmark = pytest.mark.usefixtures("no_tasks")
# the quota lock, the name, the quota's usage (per spec, and those specs), the budget; the
# instance, its creation event; the host its volumes hold it to, the hosts holding its image,
# the region's hosts, GPUs, claims and allocations, the catalog FGD plans for; the allocation
# (savepoint, its volumes' mounts, row, claim, disk host, its volumes' host, release); its
# state and that event; whether its host pulls images (a pull's note); the launch's audit entry
IN_THE_WRITE_TRANSACTION = 25


def _launch_statements(tenant, catalog, name: str) -> tuple[list[str], list[str]]:
    """The SQL of one launch: (before BEGIN, between BEGIN and COMMIT)."""
    with CaptureQueriesContext(connection) as captured:
        instance = services.launch_instance(
            tenant, name=name, spec=catalog.quarter, image=catalog.image, region=catalog.region
        )
    assert instance.state == State.PROVISIONING
    sql = [query["sql"] for query in captured.captured_queries]
    begin = next(i for i, text in enumerate(sql) if text.startswith("BEGIN"))
    commit = next(i for i, text in enumerate(sql) if text.startswith("COMMIT"))
    return sql[:begin], sql[begin + 1 : commit]


@pytest.mark.skipif(connection.vendor != "sqlite", reason="BEGIN is SQLite's")
def test_the_write_transaction_is_short_however_many_instances_the_tenant_has(
    transactional_db, catalog, tenant
):
    tenant.quota.gpu_quota = 100
    tenant.quota.max_instances = 100
    tenant.quota.save()
    catalog.host(gpus=8, mode=Mode.SHARED, vcpus=512, ram_mib=4_000_000)

    services.launch_instance(tenant, name="one", spec=catalog.quarter, image=catalog.image)
    _, first = _launch_statements(tenant, catalog, "first")
    for i in range(20):
        services.launch_instance(
            tenant, name=f"more-{i}", spec=catalog.quarter, image=catalog.image
        )
    before, later = _launch_statements(tenant, catalog, "later")

    assert len(first) == len(later) == IN_THE_WRITE_TRANSACTION, later
    # the name's first check and the region's hardware are read before the lock
    assert any("instances_instance" in text for text in before)
    assert any("fleet_gpu" in text for text in before)
