"""Month-end billing at scale, on PostgreSQL: loading usage, metering (rating segments into
pieces), finalization (the month's invoices) and the operators' CSV export.

It creates its own database (DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/billbench), migrates it, and drops it at the end (unless
--keep). Two months are billed through the production code (billing.metering.rate_pending,
billing.finalize.finalize_month, billing.exports.month_export_csv):

- February: the first --small tenants (default 1,000) × --segments segments;
- March: all --tenants tenants (default 10,000) × --segments segments (default 100),

so the finalization's query count is measured at both sizes (it must not grow with rows).
Each tenant has 5 instances on 4 specs; one spec's price changes mid-month, every tenth
segment is a stopped disk, a few segments run into the next month; one tenant in ten has a
credit grant.

Baselines, in the same run, on the March data (each inside a transaction rolled back):
finalization done naively per row with the ORM on --naive-sample tenants, extrapolated to
all tenants; and a raw INSERT … SELECT of the same invoice lines.

    .venv/bin/python bench/billing.py
    .venv/bin/python bench/billing.py --tenants 2000 --small 200 --segments 50   # quicker
    BENCH_SHOW_QUERIES=1 .venv/bin/python bench/billing.py ...    # print finalization's SQL
"""

import argparse
import os
import random
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/billbench"
INSTANCES_PER_TENANT = 5
FEBRUARY = datetime(2026, 2, 1, tzinfo=UTC)
MARCH = datetime(2026, 3, 1, tzinfo=UTC)
APRIL = datetime(2026, 4, 1, tzinfo=UTC)


class Rollback(Exception):
    pass


# --- the database ---------------------------------------------------------------------------


def admin_url(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    return urlunsplit(parts._replace(path="/postgres")), name


def create_database(url: str) -> None:
    import psycopg

    server, name = admin_url(url)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    server, name = admin_url(url)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def setup_django(url: str, work: Path) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ["GPUCLOUD_VAR_DIR"] = str(work)
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    from console import state_dir

    state_dir.prepare()
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


# --- loading --------------------------------------------------------------------------------


def load_catalog():
    from console.catalog.models import GpuModel, Image, Mode, Region, Spec, SpecPrice

    region = Region.objects.create(code="bench-1", name="Bench 1")
    image = Image.objects.create(name="bench-image", cuda_version="12.4")
    gpu = GpuModel.objects.create(code="a100-80gb", name="NVIDIA A100 80GB", memory_mib=81920)
    specs = []
    for code, mode, milli, count, price, disk in [
        ("a100-eighth", Mode.SHARED, 125, 1, "0.45", 25),
        ("a100-quarter", Mode.SHARED, 250, 1, "0.90", 50),
        ("a100-half", Mode.SHARED, 500, 1, "1.80", 100),
        ("a100-1x", Mode.WHOLE, None, 1, "3.20", 200),
    ]:
        spec = Spec.objects.create(
            code=code, name=code.upper(), gpu_model=gpu, mode=mode, milli=milli,
            gpu_count=count, gpu_memory_mib=20480, vcpus=8, ram_mib=32768, disk_gib=disk,
            price_per_hour=Decimal(price),
        )  # fmt: skip
        SpecPrice.objects.create(
            spec=spec,
            effective_from=datetime(2020, 1, 1, tzinfo=UTC),
            price_per_hour=spec.price_per_hour,
        )
        specs.append(spec)
    for month in (FEBRUARY, MARCH):  # the quarter gets cheaper mid-month, then back
        SpecPrice.objects.create(
            spec=specs[1], effective_from=month + timedelta(days=14, hours=12),
            price_per_hour=Decimal("0.80"),
        )  # fmt: skip
        SpecPrice.objects.create(
            spec=specs[1], effective_from=month + timedelta(days=20), price_per_hour=Decimal("0.90")
        )
    return region, image, specs


def load_tenants(count: int, region, image, specs):
    from accounts.models import Quota, Tenant
    from billing.models import CreditGrant
    from console.instances.models import Instance, State

    Tenant.objects.bulk_create(
        [Tenant(name=f"Tenant {n:05d}", slug=f"tenant-{n:05d}") for n in range(count)],
        batch_size=5000,
    )
    tenants = list(Tenant.objects.order_by("pk").values_list("pk", flat=True))
    Quota.objects.bulk_create([Quota(tenant_id=pk) for pk in tenants], batch_size=5000)
    rng = random.Random(7)
    Instance.objects.bulk_create(
        [
            Instance(
                tenant_id=pk,
                name=f"box-{k}",
                spec=specs[rng.randrange(len(specs))],
                image=image,
                region=region,
                state=State.TERMINATED,
            )  # fmt: skip
            for pk in tenants
            for k in range(INSTANCES_PER_TENANT)
        ],
        batch_size=5000,
    )
    CreditGrant.objects.bulk_create(
        [
            CreditGrant(
                tenant_id=pk,
                amount=Decimal("25.00"),
                remaining=Decimal("25.00"),
                granted_at=FEBRUARY - timedelta(days=1),
                kind="promotional" if n % 2 else "prepaid",
            )  # fmt: skip
            for n, pk in enumerate(tenants[::10])
        ],
        batch_size=5000,
    )
    instances: dict[int, list[tuple[int, int, int]]] = {}
    for pk, tenant_id, spec_id, disk in Instance.objects.order_by("pk").values_list(
        "pk", "tenant_id", "spec_id", "spec__disk_gib"
    ):
        instances.setdefault(tenant_id, []).append((pk, spec_id, disk))
    return tenants, instances


def load_segments(month: datetime, tenants, instances, per_tenant: int, seed: int) -> int:
    """``per_tenant`` closed segments per tenant spread over the month, loaded with COPY."""
    from django.db import connection, transaction

    from billing.models import UsageKind, UsageSegment

    rng = random.Random(seed)
    month_seconds = int(((month + timedelta(days=32)).replace(day=1) - month).total_seconds())
    slot = month_seconds // per_tenant
    disk_price = Decimal("0.10")
    created = datetime.now(UTC)
    columns = (
        "tenant_id", "instance_id", "kind", "spec_id", "disk_gib", "disk_price_per_gib_month",
        "started_at", "ended_at", "rated", "source", "created_at",
    )  # fmt: skip
    total = 0
    table = UsageSegment._meta.db_table
    sql = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
    with transaction.atomic(), connection.cursor() as cursor, cursor.cursor.copy(sql) as copy:
        for tenant_id in tenants:
            boxes = instances[tenant_id]
            for index in range(per_tenant):
                instance_id, spec_id, disk = boxes[index % len(boxes)]
                start = month + timedelta(
                    seconds=index * slot + rng.randrange(0, max(1, slot // 10)),
                    microseconds=rng.randrange(1_000_000),
                )
                length = timedelta(
                    seconds=rng.randrange(1, int(slot * 1.2)),
                    microseconds=rng.randrange(10**6),
                )
                is_disk = index % 10 == 9
                copy.write_row(
                    (
                        tenant_id,
                        instance_id,
                        UsageKind.DISK if is_disk else UsageKind.GPU,
                        spec_id,
                        disk if is_disk else 0,
                        disk_price if is_disk else None,
                        start,
                        start + length,
                        False,
                        "signal",
                        created,
                    )  # fmt: skip
                )
                total += 1
    return total


# --- phases ---------------------------------------------------------------------------------


class Table:
    def __init__(self):
        self.rows: list[tuple] = []

    def add(self, phase: str, rows: int, unit: str, seconds: float, queries="", note=""):
        self.rows.append((phase, rows, unit, seconds, queries, note))
        rate = rows / seconds if seconds else float("inf")
        print(
            f"  {phase:<44} {rows:>11,} {unit:<9} {seconds:>9.2f} s {rate:>12,.0f}/s {queries!s:>7}"
            f"  {note}",
            flush=True,
        )

    def print(self):
        header = (
            f"{'phase':<44} {'rows':>11} {'unit':<9} {'wall':>11} {'rows/s':>14} "
            f"{'queries':>7}  note"
        )
        print()
        print(header)
        print("-" * len(header))
        for phase, rows, unit, seconds, queries, note in self.rows:
            rate = rows / seconds if seconds else float("inf")
            print(
                f"{phase:<44} {rows:>11,} {unit:<9} {seconds:>9.2f} s {rate:>12,.0f}/s "
                f"{queries!s:>7}  {note}"
            )


def timed(function, *args, **kwargs):
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start


def meter_month(month: datetime, now: datetime):
    from billing.metering import rate_pending

    return timed(rate_pending, now, period=(month, (month + timedelta(days=32)).replace(day=1)),
                 chunk_size=5000)  # fmt: skip


def finalize(month: datetime, now: datetime):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from billing.finalize import finalize_month

    with CaptureQueriesContext(connection) as queries:
        result, seconds = timed(finalize_month, month.date(), now=now)
    if os.environ.get("BENCH_SHOW_QUERIES"):
        for query in queries.captured_queries:
            print("    ", query["sql"][:150])
    return result, seconds, len(queries)


def export_csv(month: datetime):
    from billing.exports import issued, month_export_csv

    def run():
        return month_export_csv(issued(month.date()))

    text, seconds = timed(run)
    return text.count("\n") - 1, seconds, len(text)


def naive_finalization(month: datetime, sample: int, now: datetime) -> tuple[int, float]:
    """The baseline: per-row ORM finalization of ``sample`` tenants (rolled back)."""
    from collections import defaultdict

    from django.db import transaction

    from billing.models import Invoice, InvoiceLine, UsagePiece, micros_to_decimal
    from billing.rating import invoice_totals, quantize_amount

    drafts = list(
        Invoice.objects.filter(month=month.date(), status="draft").order_by("pk")[:sample]
    )
    start = time.perf_counter()
    lines_written = 0
    try:
        with transaction.atomic():
            for number, invoice in enumerate(drafts, start=1):
                sums = defaultdict(lambda: [0, 0])
                for piece in UsagePiece.objects.filter(
                    tenant_id=invoice.tenant_id, month=month.date()
                ):
                    key = (piece.kind, piece.instance.name, piece.spec.code, piece.unit_price)
                    sums[key][0] += piece.seconds
                    sums[key][1] += piece.amount_micros
                amounts = []
                for position, ((kind, name, code, price), (seconds, micros)) in enumerate(
                    sorted(sums.items()), start=1
                ):
                    amount = quantize_amount(micros_to_decimal(micros))
                    amounts.append(amount)
                    InvoiceLine.objects.create(
                        invoice=invoice, position=position, kind=kind, instance_name=name,
                        spec_code=code, description=f"{kind} {code}", seconds=seconds,
                        unit_price_per_hour=price, amount=amount,
                    )  # fmt: skip
                    lines_written += 1
                totals = invoice_totals(amounts)
                invoice.status = "finalized"
                invoice.number = f"NAIVE-{number:06d}"
                invoice.issued_at = now
                invoice.subtotal, invoice.total = totals.subtotal, totals.total
                invoice.save()
            raise Rollback
    except Rollback:
        pass
    return lines_written, time.perf_counter() - start


def insert_select_lines(month: datetime) -> tuple[int, float]:
    """The floor: the month's invoice lines as one INSERT … SELECT (rolled back)."""
    from django.db import connection, transaction

    sql = """
        INSERT INTO billing_invoiceline
            (invoice_id, position, kind, instance_id, instance_name, spec_code, description,
             seconds, unit_price_per_hour, amount)
        SELECT inv.id,
               row_number() OVER (
                   PARTITION BY inv.id ORDER BY p.kind, i.name, s.code, p.unit_price
               ),
               p.kind, p.instance_id, i.name, s.code, 'GPU time: ' || s.name,
               SUM(p.seconds), p.unit_price, SUM(p.amount_micros)::numeric / 1000000
        FROM billing_usagepiece p
        JOIN billing_invoice inv
          ON inv.tenant_id = p.tenant_id AND inv.month = p.month AND inv.kind = 'invoice'
             AND inv.status = 'draft'
        JOIN instances_instance i ON i.id = p.instance_id
        JOIN catalog_spec s ON s.id = p.spec_id
        WHERE p.month = %s
        GROUP BY inv.id, p.kind, p.instance_id, i.name, s.code, s.name, p.unit_price, p.disk_gib
    """
    start = time.perf_counter()
    rows = 0
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [month.date()])
            rows = cursor.rowcount
            raise Rollback
    except Rollback:
        pass
    return rows, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--segments", type=int, default=100, help="per tenant and month")
    parser.add_argument("--naive-sample", type=int, default=200)
    parser.add_argument("--keep", action="store_true", help="keep the database")
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    if not url.startswith(("postgres://", "postgresql://")):
        sys.exit("bench/billing.py runs on PostgreSQL: set DATABASE_URL=postgres://…")
    work = Path(tempfile.mkdtemp(prefix="billbench-"))
    print(f"database {url} (created and dropped here)", flush=True)
    create_database(url)
    setup_django(url, work)
    table = Table()
    try:
        run(args, table)
    finally:
        table.print()
        if not args.keep:
            drop_database(url)


def run(args, table: Table) -> None:
    from billing.models import InvoiceLine, UsagePiece

    started = time.perf_counter()
    region, image, specs = load_catalog()
    (tenants, instances), seconds = timed(load_tenants, args.tenants, region, image, specs)
    table.add("load tenants, quotas, instances", len(tenants) * (2 + INSTANCES_PER_TENANT), "rows",
              seconds)  # fmt: skip
    small = tenants[: args.small]

    count, seconds = timed(load_segments, FEBRUARY, small, instances, args.segments, 1)
    table.add(f"load Feb segments ({len(small):,} tenants, COPY)", count, "segments", seconds)
    count, seconds = timed(load_segments, MARCH, tenants, instances, args.segments, 2)
    table.add(f"load Mar segments ({len(tenants):,} tenants, COPY)", count, "segments", seconds)

    written, seconds = meter_month(FEBRUARY, MARCH + timedelta(hours=6))
    table.add("metering Feb (rate segments → pieces)", written, "pieces", seconds)
    result, seconds, queries = finalize(FEBRUARY, MARCH + timedelta(hours=6))
    pieces = UsagePiece.objects.filter(month=FEBRUARY.date()).count()
    table.add(f"finalization Feb ({result.invoices:,} invoices)", pieces, "pieces", seconds,
              queries, f"{result.lines:,} lines")  # fmt: skip

    written, seconds = meter_month(MARCH, APRIL + timedelta(hours=6))
    table.add("metering Mar (rate segments → pieces)", written, "pieces", seconds)
    pieces = UsagePiece.objects.filter(month=MARCH.date()).count()

    lines, seconds = naive_finalization(MARCH, args.naive_sample, APRIL + timedelta(hours=6))
    factor = len(tenants) / max(1, args.naive_sample)
    table.add(f"baseline: naive ORM, {args.naive_sample} tenants", lines, "lines", seconds)
    table.add(f"baseline: naive ORM extrapolated ×{factor:.0f}", round(pieces), "pieces",
              seconds * factor, "", "per-row reads and writes")  # fmt: skip
    rows, seconds = insert_select_lines(MARCH)
    table.add("baseline: raw INSERT … SELECT of the lines", rows, "lines", seconds, 1,
              "lines only: no totals, credits, numbers")  # fmt: skip

    result, seconds, queries = finalize(MARCH, APRIL + timedelta(hours=6))
    table.add(f"finalization Mar ({result.invoices:,} invoices)", pieces, "pieces", seconds,
              queries, f"{result.lines:,} lines, credits {result.credits_applied}")  # fmt: skip
    verdict = "PASS" if seconds < 60 else "FAIL"
    print(f"  finalization of the whole month: {seconds:.1f} s ({verdict}: target < 60 s)")

    rows, seconds, size = export_csv(MARCH)
    table.add("CSV export Mar (every invoice line)", rows, "rows", seconds, "",
              f"{size / 1e6:.1f} MB")  # fmt: skip
    assert InvoiceLine.objects.filter(invoice__month=MARCH.date()).count() == rows
    print(f"  total wall time {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
