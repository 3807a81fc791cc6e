"""Two workers at once: the same month finalized twice in parallel, the same transition
recorded twice in parallel. Real threads, real transactions (PostgreSQL in CI)."""

import threading
from datetime import timedelta

import pytest
from django.db import connection

from billing import metering, services
from billing.models import Invoice, InvoiceLine, UsageSegment
from console.instances.models import State
from tests.billing.conftest import at, move
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)


def in_threads(count: int, target) -> list:
    barrier = threading.Barrier(count)
    results: list = []
    errors: list = []

    def run():
        try:
            barrier.wait(timeout=30)
            results.append(target())
        except Exception as error:  # reported below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return results


def test_parallel_finalizations_issue_each_invoice_once(world):
    for _ in range(6):
        tenant = TenantFactory()
        box = world.running(tenant, at(2026, 3, 2))
        move(box, State.TERMINATING, at(2026, 3, 2, 3))
    services.run_meter(at(2026, 3, 3))
    results = in_threads(
        3, lambda: services.finalize_month(at(2026, 3, 1).date(), now=at(2026, 4, 1, 2))
    )
    assert sorted(result.invoices for result in results) == [0, 0, 6]
    numbers = sorted(Invoice.objects.values_list("number", flat=True))
    assert numbers == [f"GC-2026-{n:06d}" for n in range(1, 7)]
    assert InvoiceLine.objects.count() == 6


def test_parallel_receivers_open_one_segment(world, tenant):
    box = world.instance(tenant)
    when = at(2026, 3, 2) + timedelta(microseconds=7)
    in_threads(4, lambda: metering.record_transition(box, State.PROVISIONING, State.RUNNING, when))
    assert UsageSegment.objects.filter(instance=box).count() == 1
    in_threads(4, lambda: metering.record_transition(box, State.RUNNING, State.STOPPING, when))
    segment = UsageSegment.objects.get(instance=box)
    assert segment.ended_at == when
