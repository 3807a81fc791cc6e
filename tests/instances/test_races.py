"""Races with real threads, each with its own database connection: on PostgreSQL (when
DATABASE_URL points at one: the Quota and Gpu row locks) and on SQLite (IMMEDIATE
transactions serialise the writers). Quotas hold and no slice is ever given twice."""

import threading
from decimal import Decimal

import pytest
from django.db import close_old_connections, connection

from accounts.models import Quota
from console.catalog.models import Mode
from console.instances import queue, services
from console.instances.models import GpuClaim, Instance, State
from tests.factories import TenantFactory
from tests.instances.helpers import make_instance

pytestmark = pytest.mark.usefixtures("no_tasks")
THREADS = 10


def race(work, n=THREADS):
    """Run work(i) in n threads released at once; answers the outcomes (value or exception)."""
    barrier = threading.Barrier(n)
    outcomes: list = [None] * n

    def run(i):
        try:
            barrier.wait()
            outcomes[i] = work(i)
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test looks at
            outcomes[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    close_old_connections()
    return outcomes


def test_concurrent_launches_never_pass_the_gpu_quota(transactional_db, catalog, tenant):
    Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal("1"), max_instances=50)
    catalog.host(gpus=4, mode=Mode.SHARED)

    outcomes = race(
        lambda i: services.launch_instance(
            tenant, name=f"r{i}", spec=catalog.quarter, image=catalog.image
        )
    )
    launched = [o for o in outcomes if isinstance(o, Instance)]
    refused = [o for o in outcomes if isinstance(o, services.QuotaExceeded)]
    assert len(launched) == 4, outcomes
    assert len(refused) == THREADS - 4
    assert Instance.objects.filter(tenant=tenant).count() == 4


def test_concurrent_launches_never_pass_the_instance_count(transactional_db, catalog, tenant):
    catalog.cordoned()
    Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal("100"), max_instances=3)
    outcomes = race(
        lambda i: services.launch_instance(
            tenant, name=f"c{i}", spec=catalog.quarter, image=catalog.image
        )
    )
    assert sum(isinstance(o, Instance) for o in outcomes) == 3, outcomes
    assert Instance.objects.filter(tenant=tenant).count() == 3


def test_concurrent_starts_and_resizes_hold_the_quota(transactional_db, catalog, tenant):
    Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal("1"), max_instances=50)
    stopped = [
        make_instance(catalog, tenant, state=State.STOPPED, name=f"s{i}") for i in range(THREADS)
    ]

    def work(i):
        # half of them start as they are, half first grow to a half GPU (and then start)
        if i % 2:
            services.resize_instance(stopped[i], catalog.half)
        return services.start_instance(Instance.objects.get(pk=stopped[i].pk))

    race(work)
    used = sum(
        (
            i.spec.gpu_equivalents
            for i in Instance.objects.filter(tenant=tenant, state=State.PENDING)
        ),
        Decimal(0),
    )
    assert Decimal("0.75") <= used <= Decimal("1")


def test_no_slice_is_given_twice(transactional_db, catalog):
    """Ten tenants launch MIG 1g slices at once on one GPU with seven legal starts."""
    catalog.host(gpus=1, mode=Mode.MIG)
    tenants = [TenantFactory(slug=f"t{i}") for i in range(THREADS)]
    Quota.objects.update(gpu_quota=Decimal("8"), max_instances=50)

    def work(i):
        return services.launch_instance(
            tenants[i], name="slice", spec=catalog.mig1g, image=catalog.image
        )

    outcomes = race(work)
    assert all(isinstance(o, Instance) for o in outcomes), outcomes
    states = sorted(Instance.objects.values_list("state", flat=True))
    assert states.count(State.PROVISIONING) == 7
    assert states.count(State.PENDING) == 3
    slots = list(GpuClaim.objects.values_list("slot", flat=True))
    assert sorted(slots) == [0, 1, 2, 3, 4, 5, 6]


def test_schedulers_racing_place_each_instance_once(transactional_db, catalog, tenant):
    Quota.objects.filter(tenant=tenant).update(gpu_quota=Decimal("100"), max_instances=50)
    for i in range(12):
        make_instance(catalog, tenant, state=State.PENDING, spec=catalog.mig1g, name=f"q{i}")
    catalog.host(gpus=1, mode=Mode.MIG)
    catalog.host(gpus=1, mode=Mode.MIG)

    race(lambda i: queue.schedule_pending(), n=4)
    queue.schedule_pending()  # the next beat: whatever lost every race meanwhile
    assert Instance.objects.filter(state=State.PROVISIONING).count() == 12
    pairs = list(GpuClaim.objects.values_list("gpu_id", "slot"))
    assert len(pairs) == len(set(pairs)) == 12
