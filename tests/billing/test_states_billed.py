"""A disk that exists is billed (issue 27, item 4): a failed instance and one queued again
after a stop keep their disk on its host, and pay for it as a stopped one does, until
terminate. A run that failed at the instant it began (its workload never ran) costs nothing
(item 6)."""

from decimal import Decimal

import pytest

from billing import services
from billing.models import UsageKind, UsagePiece, UsageSegment
from console.instances.models import State
from tests.billing.conftest import at, move, walk

S = State


@pytest.fixture(autouse=True)
def disk_price(settings):
    settings.BILLING_DISK_PRICE_PER_GIB_MONTH = Decimal("0.10")


def billed(box, kind):
    pieces = UsagePiece.objects.filter(instance=box, kind=kind)
    return sum(p.seconds for p in pieces), sum((p.amount for p in pieces), Decimal(0))


def test_a_failed_instances_disk_is_billed_until_terminate(world, tenant):
    box = world.running(tenant, at(2026, 4, 1))
    move(box, S.FAILED, at(2026, 4, 1, 1))
    move(box, S.TERMINATING, at(2026, 4, 16, 1))  # 15 days of a 30-day month
    services.run_meter(at(2026, 4, 20))
    assert billed(box, UsageKind.DISK) == (15 * 86400, Decimal("2.500000"))  # 50 GiB × 0.10 / 2


def test_a_disk_queued_to_start_again_is_billed_as_stopped(world, tenant):
    box = world.running(tenant, at(2026, 4, 1))
    walk(box, [S.STOPPING, S.STOPPED], at(2026, 4, 1, 1))
    move(box, S.PENDING, at(2026, 4, 6, 1))  # start: nothing fits, waits for its disk's host
    move(box, S.PROVISIONING, at(2026, 4, 16, 1))
    services.run_meter(at(2026, 4, 20))
    assert billed(box, UsageKind.DISK) == (15 * 86400, Decimal("2.500000"))


def test_a_failed_start_keeps_billing_the_disk_and_costs_no_gpu(world, tenant):
    box = world.running(tenant, at(2026, 4, 1))
    walk(box, [S.STOPPING, S.STOPPED], at(2026, 4, 1, 1))
    walk(box, [S.STARTING, S.FAILED], at(2026, 4, 6, 1))  # image_not_found: never ran
    walk(box, [S.TERMINATING], at(2026, 4, 16, 1))
    services.run_meter(at(2026, 4, 20))
    assert billed(box, UsageKind.DISK) == (15 * 86400, Decimal("2.500000"))
    assert billed(box, UsageKind.GPU)[0] == 3600


@pytest.mark.parametrize("deliver", [True, False])
def test_a_run_that_failed_as_it_began_costs_nothing(world, tenant, deliver):
    """command_not_found: the console saw it running, the agent says it never ran, and the
    failure is recorded at the run's start (outcomes.fail_instance)."""
    box = world.running(tenant, at(2026, 4, 1))
    move(box, S.FAILED, at(2026, 4, 1), deliver=deliver)
    services.run_meter(at(2026, 4, 2))
    services.run_meter(at(2026, 4, 2))
    assert not UsageSegment.objects.filter(instance=box, kind=UsageKind.GPU).exists()
    assert billed(box, UsageKind.GPU) == (0, Decimal(0))


def test_a_stop_as_it_began_still_bills_the_minimum(world, tenant, settings):
    settings.BILLING_MINIMUM_SECONDS = 60
    box = world.running(tenant, at(2026, 4, 1))
    move(box, S.STOPPING, at(2026, 4, 1))
    services.run_meter(at(2026, 4, 2))
    assert billed(box, UsageKind.GPU)[0] == 60
