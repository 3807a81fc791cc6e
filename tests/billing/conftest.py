"""Fixtures of the billing tests: a small catalog, instances made in the database, and
transitions through the real lifecycle whose after-commit signal is delivered (or, to
simulate a crash between the commit and the receiver, dropped)."""

import itertools
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.db import connection, transaction

from billing.models import Invoice, InvoiceLine, UsagePiece, UsageSegment
from billing.rating import quantize_amount
from console.catalog.models import Mode, SpecPrice
from console.instances import lifecycle
from console.instances.models import Instance, State
from tests.factories import GpuModelFactory, ImageFactory, RegionFactory, SpecFactory
from tests.instances.helpers import make_instance

_serial = itertools.count(1)
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


MARCH = at(2026, 3, 1).date()
APRIL = at(2026, 4, 1).date()
APRIL_1 = at(2026, 4, 1, 2)  # after the grace period
MARCH_SECONDS = 31 * 86400


def stored_amount(gib, price: str, seconds: int, month_seconds: int = MARCH_SECONDS) -> Decimal:
    """What keeping `gib` GiB for `seconds` costs at `price` per GiB-month (volumes, snapshots),
    in a month of `month_seconds`."""
    return quantize_amount(Decimal(gib) * Decimal(price) * seconds / month_seconds)


def move(instance: Instance, to_state: str, when: datetime | None = None, *, deliver=True):
    """Run a real transition (lifecycle.transition) and its after-commit callbacks, which
    send instance_state_changed; with deliver=False they are lost, as in a crash right
    after the commit."""
    start = len(connection.run_on_commit)
    with transaction.atomic():
        event = lifecycle.transition(instance, to_state, at=when)
    callbacks = connection.run_on_commit[start:]
    del connection.run_on_commit[start:]
    if deliver:
        for _, callback, _robust in callbacks:
            callback()
    return event


def walk(instance: Instance, states, when: datetime, *, deliver=True) -> None:
    for state in states:
        move(instance, state, when, deliver=deliver)


class World:
    def __init__(self):
        self.region = RegionFactory()
        self.image = ImageFactory()
        gpu = GpuModelFactory()
        self.quarter = SpecFactory(
            code="a100-quarter", name="A100 1/4", gpu_model=gpu, mode=Mode.SHARED, milli=250,
            disk_gib=50, price_per_hour=Decimal("0.9000"),
        )  # fmt: skip
        self.whole = SpecFactory(
            code="a100-1x", name="A100 x1", gpu_model=gpu, mode=Mode.WHOLE, milli=None,
            gpu_memory_mib=81920, disk_gib=200, price_per_hour=Decimal("3.2000"),
        )  # fmt: skip
        SpecPrice.objects.create(
            spec=self.quarter, effective_from=LONG_AGO, price_per_hour=Decimal("0.9000")
        )

    def instance(self, tenant, *, spec=None, name=None, when=None, state=State.PENDING, **extra):
        """A new instance with its first event (no signal: pending bills nothing)."""
        name = name or f"box-{next(_serial)}"
        return make_instance(self, tenant, state=state, spec=spec, name=name, when=when, **extra)

    def running(self, tenant, when: datetime, **kwargs) -> Instance:
        instance = self.instance(tenant, when=when, **kwargs)
        walk(instance, [State.PROVISIONING, State.RUNNING], when)
        return instance


@pytest.fixture
def world(db):
    return World()


def snapshot() -> list:
    """Every billing row, to show that running a job again changes nothing."""
    return [
        list(UsageSegment.objects.order_by("pk").values()),
        list(UsagePiece.objects.order_by("pk").values()),
        list(Invoice.objects.order_by("pk").values()),
        list(InvoiceLine.objects.order_by("pk").values()),
    ]
