"""Storage lines show figures that multiply (issue 42, item 9): a disk while not running, a
volume and a snapshot are priced per GiB-month, and every line shows its GiB, its seconds,
the seconds of its month and the price per GiB-month, whose product, rounded once to 6
places, is the amount it shows: on the usage page, the invoice page, the PDF, the CSV and the
JSON (no price per hour rounded to 6 places, which would not: 0.000077/h × 2,329,077 s is
0.0498, not the 0.049991 the line said)."""

import csv
import io
import json
import re
from decimal import ROUND_HALF_UP, Decimal

import pytest
from pypdf import PdfReader

from billing import exports, services
from billing.models import Invoice
from console.instances.models import State
from console.snapshots.models import StoreMeasurement
from console.volumes.models import Volume
from tests.billing.conftest import MARCH, at, walk

pytestmark = pytest.mark.django_db

GIB = 1024**3
MARCH_SECONDS = 31 * 86400
FIGURES = re.compile(
    r"([\d.]+) GiB × ([\d,]+) s / ([\d,]+) s × ([\d.]+) per GiB-month\)"
    r".*?([-\d,]+\.\d{6}) USD(?!\s*/)",  # the amount, not the price per GiB-month
    re.S,
)


def product(gib: str, seconds: str, month_seconds: str, price: str) -> Decimal:
    exact = Decimal(gib) * int(seconds.replace(",", "")) * Decimal(price)
    return (exact / int(month_seconds.replace(",", ""))).quantize(
        Decimal("0.000001"), rounding=ROUND_HALF_UP
    )


def check_text(text: str) -> list[tuple]:
    """Every storage line of a page or PDF text: its figures multiply to its amount."""
    found = FIGURES.findall(" ".join(text.split()))
    for gib, seconds, month_seconds, price, amount in found:
        assert product(gib, seconds, month_seconds, price) == Decimal(amount.replace(",", ""))
    return found


def check_rows(lines: list[dict]) -> int:
    """The CSV's or JSON's storage lines: gib × seconds / month_seconds × price = amount."""
    storage = [line for line in lines if line["gib"]]
    for line in storage:
        assert not line["unit_price_per_hour"]
        figures = (line["gib"], str(line["seconds"]), str(line["month_seconds"]))
        expected = product(*figures, line["unit_price_per_gib_month"])
        assert expected == Decimal(line["amount"])
    return len(storage)


@pytest.fixture
def storage(world, tenant):
    """In March: a 50 GiB disk stopped from Mar 4 01:02:03 (2,415,477 s), a 100 GiB volume
    for 178,200 s, a snapshot store holding 1.5 GiB and 12,345 bytes from Mar 3 (2,505,600 s)."""
    box = world.running(tenant, at(2026, 3, 1))
    walk(box, [State.STOPPING, State.STOPPED], at(2026, 3, 4, 1, 2, 3))
    Volume.objects.create(
        tenant=tenant, name="data", size_gib=100, region=world.region,
        price_per_gib_month=Decimal("0.10"), created_at=at(2026, 3, 10, 8),
        deleted_at=at(2026, 3, 12, 9, 30),
    )  # fmt: skip
    StoreMeasurement.objects.create(
        tenant=tenant, measured_at=at(2026, 3, 3), bytes=GIB * 3 // 2 + 12_345,
        price_per_gib_month=Decimal("0.05"),
    )  # fmt: skip
    return box


def test_every_storage_line_multiplies_on_page_pdf_csv_and_json(storage, tenant, web):
    live = web.get("/billing/usage/?month=2026-03").content.decode()
    assert len(check_text(live)) == 3  # rated live: the month is not issued yet
    services.run_meter(at(2026, 4, 1, 1))
    services.finalize_due(at(2026, 4, 1, 1))
    invoice = Invoice.objects.get(tenant=tenant, month=MARCH)
    page = web.get("/billing/usage/?month=2026-03").content.decode()
    found = check_text(page)
    assert sorted((gib, seconds) for gib, seconds, *_ in found) == [
        ("1.500011497177183628082275390625", "2,505,600"),
        ("100", "178,200"),
        ("50", "2,415,477"),
    ]
    assert all(month_seconds == f"{MARCH_SECONDS:,}" for _, _, month_seconds, *_ in found)
    assert len(check_text(web.get(f"/billing/invoices/{invoice.pk}/").content.decode())) == 3
    pdf = exports.export(invoice, "pdf").content
    text = "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(pdf)).pages)
    text = re.sub(r"(\d)\n(\d)", r"\1\2", text)  # a long GiB figure wraps in its cell
    assert len(check_text(text)) == 3
    rows = list(csv.DictReader(io.StringIO(exports.export(invoice, "csv").content.decode())))
    assert check_rows([row for row in rows if row["row_type"] == "line"]) == 3
    data = json.loads(exports.export(invoice, "json").content)
    assert check_rows(data["lines"]) == 3
    gpu = [line for line in data["lines"] if not line["gib"]]
    assert [line["unit_price_per_hour"] for line in gpu] == ["0.900000"]


def test_the_draft_export_shows_the_same_figures(storage, tenant):
    services.run_meter(at(2026, 3, 20))
    invoice = Invoice.objects.get(tenant=tenant, month=MARCH)
    content = exports.export(invoice, "csv", now=at(2026, 3, 20)).content.decode()
    rows = list(csv.DictReader(io.StringIO(content)))
    assert check_rows([row for row in rows if row["row_type"] == "line"]) == 3
