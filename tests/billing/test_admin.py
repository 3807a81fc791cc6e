"""Operators in the admin: month exports, mark paid, void, credit grants."""

import csv
import io
import zipfile
from decimal import Decimal

import pytest

from billing import services
from billing.models import CreditGrant, Invoice
from console.instances.models import State
from tests.billing.conftest import at, move
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    user = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


@pytest.fixture
def issued(world, tenant, other_tenant):
    for owner in (tenant, other_tenant):
        box = world.running(owner, at(2026, 3, 3, 8))
        move(box, State.TERMINATING, at(2026, 3, 3, 9))
    services.run_meter(at(2026, 3, 4))
    services.finalize_month(at(2026, 3, 1).date(), now=at(2026, 4, 1, 2))
    return list(Invoice.objects.order_by("number"))


def test_export_a_month(operator, issued):
    response = operator.get("/admin/billing/invoice/export/?month=2026-03&format=csv")
    assert response["Content-Disposition"] == 'attachment; filename="invoices-2026-03.csv"'
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    totals = [row for row in rows if row["row_type"] == "total"]
    assert [row["invoice_number"] for row in totals] == ["GC-2026-000001", "GC-2026-000002"]
    response = operator.get("/admin/billing/invoice/export/?month=2026-03&format=zip")
    assert response["Content-Type"] == "application/zip"
    assert len(zipfile.ZipFile(io.BytesIO(response.content)).namelist()) == 2
    assert operator.get("/admin/billing/invoice/export/?month=nope").status_code == 400
    changelist = operator.get("/admin/billing/invoice/?month=2026-03").content.decode()
    assert "Export 2026-03 as CSV" in changelist


def test_actions_mark_paid_void_and_export(operator, issued):
    first, second = issued
    url = "/admin/billing/invoice/"
    operator.post(url, {"action": "mark_paid", "_selected_action": [first.pk]})
    first.refresh_from_db()
    assert first.status == "paid"
    operator.post(url, {"action": "void", "_selected_action": [second.pk]})
    second.refresh_from_db()
    assert second.status == "void" and second.credit_notes.get().number == "CN-2026-000001"
    response = operator.post(
        url, {"action": "export_csv", "_selected_action": [first.pk, second.pk]}
    )
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert "GC-2026-000002" in response.content.decode()
    response = operator.post(url, {"action": "export_pdfs", "_selected_action": [first.pk]})
    assert zipfile.ZipFile(io.BytesIO(response.content)).namelist() == [
        "invoice-GC-2026-000001.pdf"
    ]
    assert operator.get(f"/admin/billing/invoice/{first.pk}/change/").status_code == 200


def test_grant_credit_in_the_admin(operator, tenant):
    response = operator.post(
        "/admin/billing/creditgrant/add/",
        {"tenant": tenant.pk, "kind": "promotional", "amount": "25.00", "description": "launch"},
    )
    assert response.status_code == 302
    grant = CreditGrant.objects.get()
    assert (grant.remaining, grant.kind, grant.granted_by.username) == (
        Decimal("25.00"), "promotional", "root",
    )  # fmt: skip
