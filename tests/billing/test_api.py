"""/api/v1/usage/ and /api/v1/invoices/…: shapes, errors, downloads, and tenant isolation."""

import io
from decimal import Decimal

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pypdf import PdfReader

from accounts.roles import Role
from billing import documents, services
from billing.models import Invoice
from console.instances.models import State
from tests.billing.conftest import at, move
from tests.conftest import ROLES

pytestmark = pytest.mark.django_db

S = State
NOW = at(2026, 4, 15, 12)


@pytest.fixture
def usage(world, tenant, other_tenant):
    """Acme: 2 h of a quarter A100 in March (finalized), one running since April 15 10:00.
    Globex: 1 h in March. Each run ends terminated: GPU time, no disk."""
    box = world.running(tenant, at(2026, 3, 3, 8), name="train")
    move(box, S.TERMINATING, at(2026, 3, 3, 10))
    theirs = world.running(other_tenant, at(2026, 3, 5), name="secret")
    move(theirs, S.TERMINATING, at(2026, 3, 5, 1))
    services.run_meter(at(2026, 4, 1, 1))
    services.finalize_month(at(2026, 3, 1).date(), now=at(2026, 4, 1, 2))
    world.running(tenant, at(2026, 4, 15, 10), spec=world.whole, name="infer")
    services.run_meter(NOW)
    return tenant


@pytest.fixture
def viewer(usage, make_member, token_client):
    return token_client(make_member(usage, Role.VIEWER))


def test_usage_lines_and_total(viewer):
    with time_machine.travel(NOW, tick=False):
        march = viewer.get("/api/v1/usage/?month=2026-03").json()
        april = viewer.get("/api/v1/usage/").json()
    assert march["month"] == "2026-03" and march["currency"] == "USD"
    assert march["lines"] == [
        {
            "kind": "gpu",
            "instance": {"id": march["lines"][0]["instance"]["id"], "name": "train"},
            "spec": "a100-quarter",
            "description": "GPU time: A100 1/4",
            "seconds": 7200,
            "price_per_hour": "0.900000",
            "gib": None,  # storage lines: GiB × seconds / month_seconds × price_per_gib_month
            "month_seconds": None,
            "price_per_gib_month": None,
            "amount": "1.800000",
        }
    ]
    assert march["total"] == "1.800000"
    assert march["forecast"] is None
    assert april["month"] == "2026-04"
    assert april["total"] == "6.400000"  # 2 h at 3.20
    assert april["rate_per_hour"] == "3.200000"
    # 15.5 days left of April at 3.20/h
    assert Decimal(april["forecast"]) == Decimal("6.4") + Decimal("3.2") * Decimal(15 * 24 + 12)
    assert april["accruing"][0]["instance"]["name"] == "infer"
    assert sum(Decimal(day["amount"]) for day in april["daily"]) == Decimal("6.4")
    assert len(april["daily"]) == 15


@pytest.mark.parametrize("month", ["2026-13", "2026-3", "march", "1999-12", "2026-00"])
def test_bad_month_is_a_field_error(viewer, month):
    response = viewer.get(f"/api/v1/usage/?month={month}")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid" and "month" in body["errors"]


def test_invoice_list_and_detail(viewer, usage):
    with time_machine.travel(NOW, tick=False):
        listing = viewer.get("/api/v1/invoices/").json()
    assert [(i["month"], i["status"]) for i in listing["results"]] == [
        ("2026-04", "draft"),
        ("2026-03", "finalized"),
    ]
    draft, issued = listing["results"]
    assert draft["number"] is None and draft["total"] == "6.40"  # the month so far
    assert issued["number"] == "GC-2026-000001" and issued["total"] == "1.80"
    assert issued["exports"]["pdf"].endswith(f"/api/v1/invoices/{issued['id']}/export/?format=pdf")
    detail = viewer.get(f"/api/v1/invoices/{issued['id']}/").json()
    assert detail["lines"][0]["seconds"] == 7200 and detail["lines"][0]["amount"] == "1.800000"
    assert (detail["subtotal"], detail["credits_applied"], detail["tax_amount"]) == (
        "1.80", "0.00", "0.00",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("fmt", "content_type"),
    [("csv", "text/csv; charset=utf-8"), ("json", "application/json"), ("pdf", "application/pdf")],
)
def test_export_downloads(viewer, usage, fmt, content_type):
    invoice = Invoice.objects.get(tenant=usage, number="GC-2026-000001")
    response = viewer.get(f"/api/v1/invoices/{invoice.pk}/export/?format={fmt}")
    assert response.status_code == 200
    assert response["Content-Type"] == content_type
    assert response["Content-Disposition"] == (
        f'attachment; filename="invoice-GC-2026-000001.{fmt}"'
    )
    body = response.content
    if fmt == "csv":
        assert documents.parse_invoice_csv(body.decode()).total == Decimal("1.80")
    elif fmt == "json":
        assert documents.parse_invoice_json(body.decode()).total == Decimal("1.80")
    else:
        assert "GC-2026-000001" in PdfReader(io.BytesIO(body)).pages[0].extract_text()


def test_export_bad_format(viewer, usage):
    invoice = Invoice.objects.get(tenant=usage, number="GC-2026-000001")
    response = viewer.get(f"/api/v1/invoices/{invoice.pk}/export/?format=xls")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid" and "format" in response.json()["errors"]


def test_other_tenants_usage_and_invoices_are_invisible(viewer, other_tenant):
    theirs = Invoice.objects.get(tenant=other_tenant)
    for path in (
        f"/api/v1/invoices/{theirs.pk}/",
        f"/api/v1/invoices/{theirs.pk}/export/?format=pdf",
    ):
        response = viewer.get(path)
        assert response.status_code == 404
        assert response.json()["code"] == "not_found"
    assert theirs.pk not in [i["id"] for i in viewer.get("/api/v1/invoices/").json()["results"]]
    march = viewer.get("/api/v1/usage/?month=2026-03").json()
    assert "secret" not in str(march)


@pytest.mark.parametrize("role", ROLES)
def test_every_role_reads_billing(usage, make_member, token_client, role):
    client = token_client(make_member(usage, role))
    assert client.get("/api/v1/usage/").status_code == 200
    assert client.get("/api/v1/invoices/").status_code == 200
    assert client.post("/api/v1/invoices/", {}).status_code in (403, 405)


def test_anonymous_is_refused(client, usage):
    assert client.get("/api/v1/usage/").status_code == 401


def test_invoice_list_query_count_is_bounded(usage, viewer, world):
    for month in range(5, 9):
        box = world.running(usage, at(2026, month, 2))
        move(box, S.TERMINATING, at(2026, month, 2, 1))
    services.run_meter(at(2026, 9, 1, 1))
    for month in range(4, 9):
        services.finalize_month(at(2026, month, 1).date(), now=at(2026, 9, 1, 2))
    viewer.get("/api/v1/invoices/")  # warm up (the token's last use is recorded once)
    with CaptureQueriesContext(connection) as few:
        viewer.get("/api/v1/invoices/?limit=2")
    with CaptureQueriesContext(connection) as many:
        viewer.get("/api/v1/invoices/")
    # a page of five makes no more queries than a page of two (which also counts the list)
    assert len(many) <= len(few) < 15
