"""A disk that exists is billed (issue 27, item 4): in every state from the first placement
until terminate, the disk is billed where the GPU is not (running: the spec's price covers
it): a failed instance, one queued again after a stop, one pulling its image, rebooting,
unreachable or stopping. A disk that grows bills its new size from then. A run that failed
at the instant it began (its workload never ran) costs nothing (item 6)."""

import re
from decimal import Decimal

import pytest

from accounts.roles import Role
from billing import services
from billing.models import UsageKind, UsagePiece, UsageSegment
from console.instances import lifecycle
from console.instances.models import Instance, State
from tests.billing.conftest import at, move, walk
from tests.web.test_console_pages import login

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
    walk(box, [S.PROVISIONING, S.RUNNING], at(2026, 4, 16, 1))
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


HOUR_OF_50_GIB = Decimal("0.006944")  # 50 GiB × 0.10 per GiB-month × 1 h of a 30-day month


@pytest.mark.parametrize("deliver", [True, False], ids=["signal", "signal lost"])
@pytest.mark.parametrize(
    "path, after",
    [
        ([S.PROVISIONING], [S.RUNNING]),  # the first launch pulls its image for an hour
        ([S.PROVISIONING, S.RUNNING, S.STOPPING, S.STOPPED, S.STARTING], [S.RUNNING]),
        ([S.PROVISIONING, S.RUNNING, S.REBOOTING], [S.RUNNING]),
        ([S.PROVISIONING, S.RUNNING, S.UNREACHABLE], [S.RUNNING]),  # its host heard again
        ([S.PROVISIONING, S.RUNNING, S.STOPPING], [S.STOPPED, S.TERMINATING]),  # a slow stop
    ],
    ids=["provisioning", "starting", "rebooting", "unreachable", "stopping"],
)
def test_an_hour_in_a_state_between_bills_the_disk_for_that_hour(
    world, tenant, path, after, deliver
):
    """Held an hour in the last state of ``path``, then on: that hour bills its disk (it
    billed nothing: neither GPU nor disk)."""
    box = world.instance(tenant, when=at(2026, 4, 1), disk_gib=50)
    walk(box, path, at(2026, 4, 1), deliver=deliver)
    walk(box, after, at(2026, 4, 1, 1), deliver=deliver)
    if box.state == S.RUNNING:
        move(box, S.TERMINATING, at(2026, 4, 1, 2), deliver=deliver)
    services.run_meter(at(2026, 4, 2))
    assert billed(box, UsageKind.DISK) == (3600, HOUR_OF_50_GIB)


def test_terminating_bills_nothing(world, tenant):
    box = world.running(tenant, at(2026, 4, 1))
    move(box, S.TERMINATING, at(2026, 4, 1, 1))
    services.run_meter(at(2026, 4, 20))  # still terminating: its disk is being deleted
    assert billed(box, UsageKind.DISK) == (0, Decimal(0))
    assert billed(box, UsageKind.GPU)[0] == 3600


def grow_disk(box, gib, when):
    """What resize_instance does to a stopped instance: the new size, and a note."""
    Instance.objects.filter(pk=box.pk).update(disk_gib=gib)
    box.disk_gib = gib
    lifecycle.note(box, f"Resize, disk 50 → {gib} GiB", at=when)


@pytest.mark.parametrize("deliver", [True, False], ids=["signal", "signal lost"])
def test_a_disk_grown_while_stopped_bills_its_new_size_from_then(world, tenant, deliver):
    """The stopped instance's disk segment went on at 50 GiB after it grew to 200 GiB."""
    box = world.instance(tenant, when=at(2026, 4, 1), disk_gib=50)
    walk(box, [S.PROVISIONING, S.RUNNING], at(2026, 4, 1), deliver=deliver)
    walk(box, [S.STOPPING, S.STOPPED], at(2026, 4, 1, 1), deliver=deliver)
    services.run_meter(at(2026, 4, 6))
    grow_disk(box, 200, at(2026, 4, 11, 1))
    services.run_meter(at(2026, 4, 12))
    move(box, S.TERMINATING, at(2026, 4, 21, 1), deliver=deliver)
    services.run_meter(at(2026, 4, 22))
    sizes = UsagePiece.objects.filter(instance=box, kind=UsageKind.DISK).order_by("start")
    # 10 days at 50 GiB (1.666667), then 10 days at 200 GiB (6.666667)
    assert [(p.disk_gib, p.seconds) for p in sizes] == [(50, 864000), (200, 864000)]
    assert billed(box, UsageKind.DISK) == (1728000, Decimal("8.333334"))


def test_a_repair_bills_each_period_at_the_disk_size_of_its_time(world, tenant):
    """Every signal lost; the disk grew later: the repair of the earlier stop takes the size
    its events recorded, not today's."""
    box = world.instance(tenant, when=at(2026, 4, 1), disk_gib=50)
    walk(box, [S.PROVISIONING, S.RUNNING], at(2026, 4, 1), deliver=False)
    walk(box, [S.STOPPING, S.STOPPED], at(2026, 4, 1, 1), deliver=False)
    walk(box, [S.STARTING, S.RUNNING], at(2026, 4, 11, 1), deliver=False)
    walk(box, [S.STOPPING, S.STOPPED], at(2026, 4, 11, 2), deliver=False)
    grow_disk(box, 200, at(2026, 4, 11, 2))
    move(box, S.TERMINATING, at(2026, 4, 21, 2), deliver=False)
    services.run_meter(at(2026, 4, 22))
    disks = UsageSegment.objects.filter(instance=box, kind=UsageKind.DISK).order_by("started_at")
    assert [(s.started_at, s.disk_gib) for s in disks] == [
        (at(2026, 4, 1, 1), 50),
        (at(2026, 4, 11, 2), 200),
    ]
    assert billed(box, UsageKind.DISK) == (1728000, Decimal("8.333334"))


def test_the_instance_page_says_the_disk_bills_in_every_state_until_terminated(
    client, world, tenant, make_member
):
    box = world.running(tenant, at(2026, 4, 1), disk_gib=50)
    login(client, make_member(tenant, Role.VIEWER))
    page = client.get(f"/instances/{box.pk}/").content.decode()
    [cost] = re.findall(r'data-testid="stopped-cost">([^<]*)</dd>', page)
    assert cost == (
        "5.00 USD/month for its 50 GiB disk, billed in every state until terminated "
        "(while running, the price above includes it)"
    )
