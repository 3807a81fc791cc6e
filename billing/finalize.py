"""Month-end finalization: every draft invoice of a month that ended is issued.

``finalize_month`` is one transaction for the whole month and a fixed number of queries
whatever the number of tenants: it locks the number sequence, then the month's drafts in pk
order, sums the month's stored pieces grouped by invoice line in one query, applies credits,
and writes lines, credit applications and invoice totals with one bulk statement each; an
invoice whose subtotal is 0.00 is issued without a number (nothing to pay). Then the late
corrections found in the month that take money back become credit notes against the invoices
they correct (``corrections.issue_correction_notes``). Running it again finds no drafts and
no correction without its note, and changes nothing.
"""

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

from accounts.models import Tenant
from billing import documents, locks, storage
from billing.bulk import insert_rows, update_rows
from billing.corrections import issue_correction_notes
from billing.issuing import (
    CREDIT_NOTE_SERIES,
    INVOICE_SERIES,
    announce_issued,
    configured_tax_rate,
    current_issuer,
    format_number,
    invoice_line,
)
from billing.metering import locked_segments, price_history, rate_pending, store_pieces, unrated
from billing.models import (
    CreditApplication,
    CreditGrant,
    Invoice,
    InvoiceLine,
    UsagePiece,
    month_bounds,
)
from billing.rating import ZERO, invoice_totals, month_start
from billing.usage import (
    LINE_GROUP,
    LineKey,
    UsageLine,
    correction_key,
    make_line,
    month_corrections,
    stored_lines,
)
from console.audit import recorder as audit

log = logging.getLogger(__name__)

LINE_FIELDS = (
    "invoice",
    "position",
    "kind",
    "instance",
    "instance_name",
    "spec_code",
    "description",
    "seconds",
    "unit_price_per_hour",
    "storage_bytes",
    "month_seconds",
    "unit_price_per_gib_month",
    "amount",
)
INVOICE_TOTAL_FIELDS = (
    "status",
    "number",
    "issued_at",
    "currency",
    "issuer_name",
    "issuer_address",
    "issuer_tax_id",
    "tenant_name",
    "tenant_slug",
    "subtotal",
    "credits_applied",
    "tax_rate",
    "tax_amount",
    "total",
)


def finalize_grace() -> timedelta:
    """How long after a month ends its invoices wait (``BILLING_FINALIZE_GRACE_SECONDS``)."""
    return timedelta(seconds=settings.BILLING_FINALIZE_GRACE_SECONDS)


@dataclass(frozen=True)
class FinalizeResult:
    month: date
    invoices: int
    lines: int
    credits_applied: Decimal
    first_number: str | None
    last_number: str | None
    credit_notes: int = 0


@dataclass
class _Batch:
    """A finalization's writes, gathered invoice by invoice, then written with one bulk
    statement each."""

    now: datetime
    number: int  # the last number taken
    issuer: documents.Issuer = field(default_factory=current_issuer)
    tax_rate: Decimal | None = field(default_factory=configured_tax_rate)
    line_rows: list[InvoiceLine] = field(default_factory=list)
    applications: list[CreditApplication] = field(default_factory=list)
    grant_updates: list[tuple[int, Decimal]] = field(default_factory=list)
    invoice_updates: list[tuple] = field(default_factory=list)
    credits_total: Decimal = ZERO

    def issue(
        self,
        invoice_id: int,
        tenant_name: str,
        tenant_slug: str,
        lines: list[UsageLine],
        grants: list[CreditGrant],
    ) -> None:
        """Number the invoice (none for a subtotal of 0.00: nothing to pay), total its lines
        and use the tenant's credit on it."""
        totals = invoice_totals(
            (line.amount for line in lines),
            credit_available=sum((grant.remaining for grant in grants), ZERO),
            tax_rate=self.tax_rate,
        )
        self._use_credit(invoice_id, totals.credits_applied, grants)
        self.credits_total += totals.credits_applied
        number = None
        if totals.subtotal:
            self.number += 1
            number = format_number(INVOICE_SERIES, self.now.year, self.number)
        self.invoice_updates.append(
            (
                invoice_id,
                Invoice.Status.FINALIZED,
                number,
                self.now,
                settings.BILLING_CURRENCY,
                self.issuer.name,
                list(self.issuer.address_lines),
                self.issuer.tax_id or "",
                tenant_name,
                tenant_slug,
                totals.subtotal,
                totals.credits_applied,
                self.tax_rate,
                totals.tax,
                totals.total,
            )
        )
        self.line_rows.extend(
            invoice_line(invoice_id, position, line) for position, line in enumerate(lines, start=1)
        )

    def _use_credit(self, invoice_id: int, amount: Decimal, grants: list[CreditGrant]) -> None:
        """Take ``amount`` from ``grants`` in their order."""
        left = amount
        for grant in grants:
            if left <= 0:
                break
            used = min(left, grant.remaining)
            left -= used
            self.applications.append(
                CreditApplication(grant_id=grant.pk, invoice_id=invoice_id, amount=used)
            )
            self.grant_updates.append((grant.pk, grant.remaining - used))

    def write(self) -> None:
        insert_rows(InvoiceLine, LINE_FIELDS, self.line_rows)
        insert_rows(CreditApplication, ("grant", "invoice", "amount"), self.applications)
        self.grant_updates.sort()
        update_rows(CreditGrant, ["remaining"], self.grant_updates)
        update_rows(Invoice, INVOICE_TOTAL_FIELDS, self.invoice_updates)


def finalize_month(month: date, *, now: datetime | None = None) -> FinalizeResult:
    """Issue every draft invoice of ``month`` (which must have ended)."""
    now = now or timezone.now()
    period_start, period_end = month_bounds(month)
    if now < period_end:
        raise ValueError(f"{month:%Y-%m} has not ended yet")
    rate_pending(now, period=(period_start, period_end))
    with transaction.atomic():
        sequence = locks.invoice_sequence(INVOICE_SERIES, now.year)
        note_sequence = locks.invoice_sequence(CREDIT_NOTE_SERIES, now.year)
        result = _issue_invoices(month, sequence, now)
        notes = issue_correction_notes(month, note_sequence, now)
        transaction.on_commit(lambda: announce_issued(result.issued_ids + notes))
    if result.issued_ids:
        log.info(
            "finalized %d invoice(s) of %s: %s … %s",
            len(result.issued_ids),
            month,
            result.first,
            result.last,
        )
    return FinalizeResult(
        month,
        len(result.issued_ids),
        result.lines,
        result.credits,
        result.first,
        result.last,
        len(notes),
    )


@dataclass(frozen=True)
class _Issued:
    issued_ids: list[int] = field(default_factory=list)
    lines: int = 0
    credits: Decimal = ZERO
    first: str | None = None
    last: str | None = None


def _issue_invoices(month: date, sequence, now: datetime) -> _Issued:
    """Issue the drafts of ``month`` (in the finalizing transaction, ``sequence`` locked)."""
    period_start = month_bounds(month)[0]
    _create_missing_drafts(month)
    drafts = Invoice.objects.filter(
        kind=Invoice.Kind.INVOICE, month=month, status=Invoice.Status.DRAFT
    )
    locked = list(
        locks.invoices(drafts).values_list("pk", "tenant_id", "tenant__name", "tenant__slug")
    )
    if not locked:
        return _Issued()
    _rate_late_closes(month, drafts, now)
    lines = _month_lines(month, drafts, now)
    grants = _applicable_grants(drafts.values("tenant_id"), period_start, now)
    batch = _Batch(now=now, number=sequence.last_number)
    empty: list[int] = []
    for invoice_id, tenant_id, tenant_name, tenant_slug in locked:
        tenant_lines = [line for line in lines.get(tenant_id, []) if line.seconds or line.amount]
        if not tenant_lines:  # nothing billed (a failover pulled it back): never numbered
            empty.append(invoice_id)
            continue
        batch.issue(invoice_id, tenant_name, tenant_slug, tenant_lines, grants.get(tenant_id, []))
    Invoice.objects.filter(pk__in=empty).delete()
    if not batch.invoice_updates:
        return _Issued()
    batch.write()
    numbers = [row[2] for row in batch.invoice_updates if row[2]]
    sequence.last_number = batch.number
    sequence.save(update_fields=["last_number"])
    issued_ids = [row[0] for row in batch.invoice_updates]
    audit.record_all(
        [
            audit.entry(
                "invoice.issue",
                invoice,
                before={"status": Invoice.Status.DRAFT},
                after={
                    "status": invoice.status,
                    "number": invoice.number,
                    "total": invoice.total,
                },
            )
            for invoice in Invoice.objects.filter(pk__in=issued_ids).order_by("pk")
        ]
    )
    return _Issued(
        issued_ids,
        len(batch.line_rows),
        batch.credits_total,
        numbers[0] if numbers else None,
        numbers[-1] if numbers else None,
    )


def _create_missing_drafts(month: date) -> None:
    """A draft for every tenant with usage in the month and no invoice for it yet."""
    billed = UsagePiece.objects.filter(month=month).values("tenant_id")
    invoiced = Invoice.objects.filter(kind=Invoice.Kind.INVOICE, month=month).values("tenant_id")
    missing = (
        Tenant.objects.filter(Q(pk__in=billed) | Q(pk__in=storage.tenants_billed(month)))
        .exclude(pk__in=invoiced)
        .values_list("pk", flat=True)
    )
    Invoice.objects.bulk_create(
        [
            Invoice(tenant_id=tenant_id, month=month, currency=settings.BILLING_CURRENCY)
            for tenant_id in missing
        ],
        ignore_conflicts=True,
    )


def _rate_late_closes(month: date, drafts: QuerySet, now: datetime) -> None:
    """Segments of the month closed since ``rate_pending`` ran: rate them here, inside the
    finalizing transaction, so that the invoice sees them."""
    late = unrated(now, month_bounds(month)).filter(
        tenant_id__in=drafts.values("tenant_id"), ended_at__isnull=False
    )
    segments = locked_segments(late)
    if segments:
        store_pieces(segments, price_history({s.spec_id for s in segments}), now)


def _month_lines(month: date, drafts: QuerySet, now: datetime) -> dict[int, list[UsageLine]]:
    """The lines of every draft's tenant in ``month``, summed from the stored pieces and the
    corrections billed in the month, one grouped query each, and its volumes' and snapshots'
    lines (storage.py)."""
    rows = (
        UsagePiece.objects.filter(month=month, tenant_id__in=drafts.values("tenant_id"))
        .values(*LINE_GROUP)
        .annotate(seconds=Sum("seconds"), micros=Sum("amount_micros"))
        .order_by()
    )
    corrections = month_corrections(drafts.values("tenant_id"), month)
    lines: dict[int, list[UsageLine]] = defaultdict(list)
    for row in [*rows, *corrections]:
        if "corrects__number" in row:
            key, seconds = correction_key(row), row["total_seconds"]
        else:
            key = LineKey(
                row["kind"], row["instance_id"], row["spec_id"], row["unit_price"], row["disk_gib"]
            )
            seconds = row["seconds"]
        lines[row["tenant_id"]].append(
            make_line(
                key,
                month=month,
                instance_name=row["instance__name"],
                spec_code=row["spec__code"],
                spec_name=row["spec__name"],
                seconds=int(seconds),
                amount_micros=int(row["micros"]),
            )
        )
    for tenant_id, tenant_lines in stored_lines(drafts.values("tenant_id"), month, now).items():
        lines[tenant_id].extend(tenant_lines)
    for tenant_lines in lines.values():
        tenant_lines.sort(key=lambda line: line.sort_key)
    return lines


def _applicable_grants(tenant_ids: QuerySet, period_start: datetime, now: datetime):
    """Grants with credit left that the month may use, locked in pk order, grouped by tenant
    in the order they are used: promotional first, then the soonest to expire, then the
    oldest."""
    grants = locks.credit_grants(
        CreditGrant.objects.filter(
            tenant_id__in=tenant_ids, remaining__gt=0, granted_at__lte=now
        ).filter(Q(expires_at__isnull=True) | Q(expires_at__gt=period_start))
    )
    far = datetime.max.replace(tzinfo=period_start.tzinfo)
    grants.sort(
        key=lambda g: (
            g.kind != CreditGrant.Kind.PROMOTIONAL,
            g.expires_at or far,
            g.granted_at,
            g.pk,
        )
    )
    by_tenant: dict[int, list[CreditGrant]] = defaultdict(list)
    for grant in grants:
        by_tenant[grant.tenant_id].append(grant)
    return by_tenant


def due_months(now: datetime) -> list[date]:
    """Months that ended at least the grace period ago and still have drafts, and the last
    such month (whose drafts may not all exist yet)."""
    cutoff = now - finalize_grace()
    open_month = month_start(cutoff).date()
    previous = month_start(month_start(cutoff) - timedelta(days=1)).date()
    months = set(
        Invoice.objects.filter(
            kind=Invoice.Kind.INVOICE, status=Invoice.Status.DRAFT, month__lt=open_month
        )
        .values_list("month", flat=True)
        .distinct()
    )
    months.add(previous)
    return sorted(months)


def finalize_due(now: datetime | None = None) -> list[FinalizeResult]:
    """The beat task's work: finalize every month that is due. Idempotent."""
    now = now or timezone.now()
    return [finalize_month(month, now=now) for month in due_months(now)]
