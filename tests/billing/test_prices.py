"""One price source: a spec's price history. Every spec has a price point from its creation,
what a tenant is shown is what billing rates, and a price change only affects usage after
its effective time (an issued invoice never changes)."""

from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine
from django.core.exceptions import ValidationError
from django.utils import timezone

from billing import services
from billing.models import Invoice, UsagePiece
from console.catalog.models import Mode, Spec, SpecPrice
from console.instances.models import State
from tests.billing.conftest import at, move
from tests.factories import SpecFactory, UserFactory

pytestmark = pytest.mark.django_db


def amounts_by_month(instance) -> dict:
    totals: dict = {}
    for piece in UsagePiece.objects.filter(instance=instance):
        totals[piece.month.month] = totals.get(piece.month.month, Decimal(0)) + piece.amount
    return totals


def test_a_spec_is_created_with_its_first_price_point(world):
    with time_machine.travel(at(2026, 2, 10, 12), tick=False):
        spec = SpecFactory(code="fresh", price_per_hour=Decimal("1.5"))
    [point] = spec.prices.all()
    assert (point.effective_from, point.price_per_hour) == (at(2026, 2, 10, 12), Decimal("1.5"))
    assert spec.current_price() == Decimal("1.5")
    assert spec.next_price_change() is None
    with pytest.raises(ValidationError):
        Spec.objects.create(
            code="no-price", name="x", gpu_model=world.whole.gpu_model, mode=Mode.WHOLE,
            gpu_count=1, gpu_memory_mib=1, vcpus=1, ram_mib=1, disk_gib=1,
        )  # fmt: skip
    with pytest.raises(AttributeError):
        spec.price_per_hour = Decimal("2")  # a saved spec changes price with a new point


def test_a_future_price_never_rewrites_the_past(world, tenant):
    """Finding 1: a spec made in the admin, used and invoiced; its first change, effective
    next month, leaves March's invoice and April's usage so far at the old price."""
    with time_machine.travel(at(2026, 3, 1), tick=False):
        spec = SpecFactory(code="admin-made", price_per_hour=Decimal("2.0"))
    box = world.running(tenant, at(2026, 3, 31, 23), spec=spec)
    services.run_meter(at(2026, 4, 1, 1))
    services.finalize_month(at(2026, 3, 1).date(), now=at(2026, 4, 1, 1))
    march = Invoice.objects.get(tenant=tenant, month=at(2026, 3, 1).date())
    issued = (march.subtotal, march.total, list(march.lines.values_list("amount", flat=True)))
    assert march.total == Decimal("2.00")

    with time_machine.travel(at(2026, 4, 15), tick=False):
        SpecPrice.objects.create(
            spec=spec, effective_from=at(2026, 5, 1), price_per_hour=Decimal("10.0")
        )
        spec = Spec.objects.get(pk=spec.pk)
        assert spec.current_price() == Decimal("2.0")
        assert spec.next_price_change().price_per_hour == Decimal("10.0")
    services.run_meter(at(2026, 4, 15))
    march.refresh_from_db()
    assert (march.subtotal, march.total, list(march.lines.values_list("amount", flat=True))) == (
        issued
    )
    # 1 h in March at 2.0, then 14 days of April at 2.0 (a 24 h day costs 48.00)
    assert amounts_by_month(box) == {3: Decimal("2.000000"), 4: Decimal("672.000000")}
    move(box, State.TERMINATING, at(2026, 5, 1, 1))
    services.run_meter(at(2026, 5, 2))
    assert amounts_by_month(box)[5] == Decimal("10.000000")  # after the change: 10.0/h


def test_a_price_change_cannot_come_before_the_first_price(world):
    with time_machine.travel(at(2026, 3, 1), tick=False):
        spec = SpecFactory(code="later", price_per_hour=Decimal("2.0"))
    point = SpecPrice(spec=spec, effective_from=at(2026, 2, 1), price_per_hour=Decimal("1"))
    with pytest.raises(ValidationError) as error:
        point.full_clean()
    assert "effective_from" in error.value.message_dict
    with time_machine.travel(at(2026, 3, 5), tick=False):
        SpecPrice(
            spec=spec, effective_from=at(2026, 3, 2), price_per_hour=Decimal("1")
        ).full_clean()


def test_a_price_change_never_reaches_back_into_a_closed_month(world):
    with time_machine.travel(at(2026, 1, 10), tick=False):
        spec = SpecFactory(code="older", price_per_hour=Decimal("2.0"))
    with time_machine.travel(at(2026, 3, 5), tick=False):
        february = SpecPrice(spec=spec, effective_from=at(2026, 2, 20), price_per_hour=Decimal("1"))
        with pytest.raises(ValidationError) as error:
            february.full_clean()  # February is invoiced: a correction there is a credit note
        assert "open month (from 2026-03-01" in error.value.message_dict["effective_from"][0]
        SpecPrice(
            spec=spec, effective_from=at(2026, 3, 1), price_per_hour=Decimal("1")
        ).full_clean()


def test_the_price_shown_is_the_price_billed(world, tenant, client):
    """Finding 2: catalog API, instance API and pages show the price in force now, which
    is what billing rates; the next change is announced."""
    member = UserFactory()
    tenant.memberships.create(user=member, role="owner")
    client.force_login(member)
    spec = world.quarter
    change = timezone.now()  # after the spec's first price
    SpecPrice.objects.create(spec=spec, effective_from=change, price_per_hour=Decimal("1.2"))
    SpecPrice.objects.create(
        spec=spec, effective_from=at(2099, 1, 1), price_per_hour=Decimal("1.5")
    )
    catalog = {row["code"]: row for row in client.get("/api/v1/specs/").json()["results"]}
    assert catalog["a100-quarter"]["price_per_hour"] == "1.2"
    assert catalog["a100-quarter"]["next_price_change"] == {
        "effective_from": "2099-01-01T00:00:00Z",
        "price_per_hour": "1.5",
    }
    assert catalog["a100-1x"]["next_price_change"] is None
    box = world.running(tenant, change + timedelta(seconds=1))
    detail = client.get(f"/api/v1/instances/{box.pk}/").json()
    assert detail["price_per_hour"] == "1.2"
    assert "1.20 USD/hour" in client.get(f"/instances/{box.pk}/").content.decode()
    services.run_meter(change + timedelta(hours=1))
    assert UsagePiece.objects.get(instance=box).unit_price == Decimal("1.2")


def test_the_admin_creates_a_spec_with_its_price_and_only_adds_points(world, client):
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    form = {
        "code": "a100-half", "name": "A100 1/2", "gpu_model": world.whole.gpu_model_id,
        "mode": Mode.SHARED, "gpu_count": 1, "milli": 500, "gpu_memory_mib": 40960,
        "vcpus": 8, "ram_mib": 65536, "disk_gib": 100, "active": "on",
        "prices-TOTAL_FORMS": 0, "prices-INITIAL_FORMS": 0,
    }  # fmt: skip
    response = client.post("/admin/catalog/spec/add/", {**form, "price_per_hour": "1.75"})
    assert response.status_code == 302, response.content.decode()[:2000]
    spec = Spec.objects.get(code="a100-half")
    assert [p.price_per_hour for p in spec.prices.all()] == [Decimal("1.75")]
    missing = client.post("/admin/catalog/spec/add/", {**form, "code": "a100-half-2"})
    assert missing.status_code == 200 and b"price_per_hour" in missing.content
    change = client.get(f"/admin/catalog/spec/{spec.pk}/change/").content.decode()
    assert 'name="price_per_hour"' not in change  # later prices are added as points
    assert 'name="prices-0-price_per_hour"' not in change  # the first one is read only
    first = spec.prices.get()
    point = {
        "prices-TOTAL_FORMS": 2, "prices-INITIAL_FORMS": 1, "prices-0-id": first.pk,
        "prices-0-spec": spec.pk, "prices-1-spec": spec.pk, "prices-1-price_per_hour": "2.5",
        "prices-1-effective_from_0": "2099-01-01", "prices-1-effective_from_1": "00:00:00",
    }  # fmt: skip
    response = client.post(f"/admin/catalog/spec/{spec.pk}/change/", {**form, **point})
    assert response.status_code == 302, response.content.decode()[:3000]
    assert [p.price_per_hour for p in spec.price_points()] == [Decimal("1.75"), Decimal("2.5")]
    assert spec.next_price_change().effective_from == at(2099, 1, 1)
