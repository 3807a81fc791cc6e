"""Invoices: month-end finalization, numbers, credits, paid and void (with a credit note),
and the documents and exports built from them.

Finalization (``finalize_month``) is one transaction for the whole month and a fixed number
of queries whatever the number of tenants: it locks the number sequence, then the month's
drafts in pk order, sums the month's stored pieces grouped by invoice line in one query,
applies credits, and writes lines, credit applications and invoice totals with one bulk
statement each. Running it again finds no drafts and changes nothing.

Numbers are ``GC-<year>-<000001>`` per year of issue (credit notes ``CN-…``), taken from an
``InvoiceSequence`` row locked in the issuing transaction, so they have no gaps.
"""

import io
import logging
import zipfile
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Prefetch, Q, QuerySet, Sum
from django.utils import timezone

from accounts.models import Tenant
from billing import documents, locks
from billing.bulk import insert_rows, update_rows
from billing.metering import (
    locked_segments,
    price_history,
    rate_pending,
    store_pieces,
    unrated,
)
from billing.models import (
    CreditApplication,
    CreditGrant,
    Invoice,
    InvoiceLine,
    UsagePiece,
    month_bounds,
)
from billing.rating import (
    ZERO,
    InvoiceTotals,
    invoice_totals,
    month_start,
    reversed_totals,
    round_to_cents,
)
from billing.usage import (
    LINE_GROUP,
    LineKey,
    SoFar,
    UsageLine,
    correction_key,
    make_line,
    month_corrections,
    so_far,
    usage_report,
)
from console.errors import DomainError

log = logging.getLogger(__name__)

INVOICE_SERIES = "GC"
CREDIT_NOTE_SERIES = "CN"
DRAFT_NUMBER = "DRAFT"


class InvalidInvoiceState(DomainError):
    """The invoice is not in a state that allows this (answered as 409 invalid_state)."""

    code = "invalid_state"


# --- settings ----------------------------------------------------------------------------


def finalize_grace() -> timedelta:
    """How long after a month ends its invoices wait, so that late news (a host that went
    silent just before midnight is noticed a little after) still reaches the month."""
    return timedelta(seconds=getattr(settings, "BILLING_FINALIZE_GRACE_SECONDS", 900))


def configured_tax_rate() -> Decimal | None:
    rate = Decimal(settings.BILLING_TAX_RATE or 0)
    return rate if rate > 0 else None


def current_issuer() -> documents.Issuer:
    return documents.Issuer(
        name=settings.BILLING_ISSUER_NAME,
        address_lines=tuple(settings.BILLING_ISSUER_ADDRESS),
        tax_id=getattr(settings, "BILLING_ISSUER_TAX_ID", None) or None,
    )


# --- numbers -----------------------------------------------------------------------------


def format_number(series: str, year: int, number: int) -> str:
    return f"{series}-{year}-{number:06d}"


# --- finalization ------------------------------------------------------------------------


@dataclass(frozen=True)
class FinalizeResult:
    month: date
    invoices: int
    lines: int
    credits_applied: Decimal
    first_number: str | None
    last_number: str | None


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


def _month_lines(month: date, drafts: QuerySet) -> dict[int, list[UsageLine]]:
    """The lines of every draft's tenant in ``month``, summed from the stored pieces and the
    corrections billed in the month, one grouped query each."""
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
    for tenant_lines in lines.values():
        tenant_lines.sort(key=lambda line: line.sort_key)
    return lines


def _line_row(invoice_id: int, position: int, line: UsageLine) -> InvoiceLine:
    return InvoiceLine(
        invoice_id=invoice_id,
        position=position,
        kind=line.kind,
        instance_id=line.instance_id,
        instance_name=line.instance_name,
        spec_code=line.spec_code,
        description=line.description,
        seconds=line.seconds,
        unit_price_per_hour=line.unit_price_per_hour,
        amount=line.amount,
    )


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


def finalize_month(month: date, *, now: datetime | None = None) -> FinalizeResult:
    """Issue every draft invoice of ``month`` (which must have ended)."""
    now = now or timezone.now()
    period_start, period_end = month_bounds(month)
    if now < period_end:
        raise ValueError(f"{month:%Y-%m} has not ended yet")
    rate_pending(now, period=(period_start, period_end))
    with transaction.atomic():
        sequence = locks.invoice_sequence(INVOICE_SERIES, now.year)
        _create_missing_drafts(month)
        drafts = Invoice.objects.filter(
            kind=Invoice.Kind.INVOICE, month=month, status=Invoice.Status.DRAFT
        )
        locked = list(
            locks.invoices(drafts).values_list("pk", "tenant_id", "tenant__name", "tenant__slug")
        )
        if not locked:
            return FinalizeResult(month, 0, 0, ZERO, None, None)
        _rate_late_closes(month, drafts, now)
        lines = _month_lines(month, drafts)
        grants = _applicable_grants(drafts.values("tenant_id"), period_start, now)
        issuer = current_issuer()
        tax_rate = configured_tax_rate()
        line_rows: list[InvoiceLine] = []
        applications: list[CreditApplication] = []
        grant_updates: list[tuple[int, Decimal]] = []
        invoice_updates: list[tuple] = []
        number = sequence.last_number
        credits_total = ZERO
        empty: list[int] = []
        for invoice_id, tenant_id, tenant_name, tenant_slug in locked:
            tenant_lines = [
                line for line in lines.get(tenant_id, []) if line.seconds or line.amount
            ]
            if not tenant_lines:  # nothing billed (a failover pulled it back): never numbered
                empty.append(invoice_id)
                continue
            tenant_grants = grants.get(tenant_id, [])
            totals = invoice_totals(
                (line.amount for line in tenant_lines),
                credit_available=sum((grant.remaining for grant in tenant_grants), ZERO),
                tax_rate=tax_rate,
            )
            left = totals.credits_applied
            for grant in tenant_grants:
                if left <= 0:
                    break
                used = min(left, grant.remaining)
                left -= used
                applications.append(
                    CreditApplication(grant_id=grant.pk, invoice_id=invoice_id, amount=used)
                )
                grant_updates.append((grant.pk, grant.remaining - used))
            credits_total += totals.credits_applied
            number += 1
            invoice_updates.append(
                (
                    invoice_id,
                    Invoice.Status.FINALIZED,
                    format_number(INVOICE_SERIES, now.year, number),
                    now,
                    settings.BILLING_CURRENCY,
                    issuer.name,
                    list(issuer.address_lines),
                    issuer.tax_id or "",
                    tenant_name,
                    tenant_slug,
                    totals.subtotal,
                    totals.credits_applied,
                    tax_rate,
                    totals.tax,
                    totals.total,
                )
            )
            line_rows.extend(
                _line_row(invoice_id, position, line)
                for position, line in enumerate(tenant_lines, start=1)
            )
        Invoice.objects.filter(pk__in=empty).delete()
        if not invoice_updates:
            return FinalizeResult(month, 0, 0, ZERO, None, None)
        insert_rows(InvoiceLine, LINE_FIELDS, line_rows)
        insert_rows(CreditApplication, ("grant", "invoice", "amount"), applications)
        grant_updates.sort()
        update_rows(CreditGrant, ["remaining"], grant_updates)
        update_rows(Invoice, INVOICE_TOTAL_FIELDS, invoice_updates)
        first = format_number(INVOICE_SERIES, now.year, sequence.last_number + 1)
        last = invoice_updates[-1][2]
        sequence.last_number = number
        sequence.save(update_fields=["last_number"])
    log.info("finalized %d invoice(s) of %s: %s … %s", len(invoice_updates), month, first, last)
    return FinalizeResult(month, len(invoice_updates), len(line_rows), credits_total, first, last)


def _create_missing_drafts(month: date) -> None:
    """A draft for every tenant with usage in the month and no invoice for it yet."""
    billed = UsagePiece.objects.filter(month=month).values("tenant_id")
    invoiced = Invoice.objects.filter(kind=Invoice.Kind.INVOICE, month=month).values("tenant_id")
    missing = (
        Tenant.objects.filter(pk__in=billed).exclude(pk__in=invoiced).values_list("pk", flat=True)
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


# --- after issue: paid, void, credit notes -----------------------------------------------


def mark_paid(invoice: Invoice, *, actor=None, now: datetime | None = None) -> Invoice:
    """finalized → paid. Marking a paid invoice paid again changes nothing."""
    now = now or timezone.now()
    with transaction.atomic():
        changed = Invoice.objects.filter(
            pk=invoice.pk, kind=Invoice.Kind.INVOICE, status=Invoice.Status.FINALIZED
        ).update(status=Invoice.Status.PAID, paid_at=now)
        current = Invoice.objects.get(pk=invoice.pk)
    if not changed and current.status != Invoice.Status.PAID:
        raise InvalidInvoiceState(
            f"A {current.status} {current.get_kind_display().lower()} cannot be marked paid."
        )
    if changed:
        log.info(
            "invoice %s marked paid by %s", current.number, getattr(actor, "username", "system")
        )
    return current


def void_invoice(
    invoice: Invoice, *, actor=None, reason: str = "", now: datetime | None = None
) -> Invoice:
    """Void an issued invoice: it is never edited; a credit note (its own number) reverses
    it exactly (its lines and every total negated; the credits it used come back as
    negative credits and go back to their grants). Answers the credit note; voiding a void
    invoice answers the same one."""
    now = now or timezone.now()
    with transaction.atomic():
        sequence = locks.invoice_sequence(CREDIT_NOTE_SERIES, now.year)
        original = locks.invoice(invoice.pk)
        if original.kind != Invoice.Kind.INVOICE:
            raise InvalidInvoiceState("A credit note cannot be voided.")
        if original.status == Invoice.Status.VOID:
            return Invoice.objects.get(corrects=original)
        if original.status == Invoice.Status.DRAFT:
            raise InvalidInvoiceState("A draft is not issued yet, so it cannot be voided.")
        applications = list(original.credit_applications.order_by("grant_id"))
        grants = {
            grant.pk: grant
            for grant in locks.credit_grants(
                CreditGrant.objects.filter(pk__in=[a.grant_id for a in applications])
            )
        }
        for application in applications:
            grant = grants[application.grant_id]
            grant.remaining += application.amount
            grant.save(update_fields=["remaining"])
        lines = [
            documents.InvoiceLine(
                description=f"Reversal of {original.number}: {line.description}",
                instance_name=line.instance_name,
                spec_code=line.spec_code,
                seconds=line.seconds,
                unit_price_per_hour=line.unit_price_per_hour,
                amount=-line.amount,
            )
            for line in original.lines.order_by("position")
        ]
        totals = reversed_totals(
            InvoiceTotals(
                subtotal=original.subtotal,
                credits_applied=original.credits_applied,
                credit_remaining=ZERO,
                tax=original.tax_amount,
                total=original.total,
            )
        )
        sequence.last_number += 1
        sequence.save(update_fields=["last_number"])
        note = Invoice.objects.create(
            tenant_id=original.tenant_id,
            kind=Invoice.Kind.CREDIT_NOTE,
            month=original.month,
            status=Invoice.Status.FINALIZED,
            number=format_number(CREDIT_NOTE_SERIES, now.year, sequence.last_number),
            issued_at=now,
            currency=original.currency,
            issuer_name=original.issuer_name,
            issuer_address=original.issuer_address,
            issuer_tax_id=original.issuer_tax_id,
            tenant_name=original.tenant_name,
            tenant_slug=original.tenant_slug,
            subtotal=totals.subtotal,
            credits_applied=totals.credits_applied,
            tax_rate=original.tax_rate,
            tax_amount=totals.tax,
            total=totals.total,
            corrects=original,
        )
        InvoiceLine.objects.bulk_create(
            InvoiceLine(
                invoice=note,
                position=position,
                description=line.description[:300],
                instance_name=line.instance_name,
                spec_code=line.spec_code,
                seconds=line.seconds,
                unit_price_per_hour=line.unit_price_per_hour,
                amount=line.amount,
            )
            for position, line in enumerate(lines, start=1)
        )
        Invoice.objects.filter(pk=original.pk).update(
            status=Invoice.Status.VOID, voided_at=now, void_reason=reason[:200]
        )
    log.warning(
        "invoice %s voided by %s (%s); credit note %s",
        original.number,
        getattr(actor, "username", "system"),
        reason,
        note.number,
    )
    return note


# --- credits -----------------------------------------------------------------------------


def grant_credit(
    tenant: Tenant,
    amount: Decimal | str,
    *,
    kind: str = CreditGrant.Kind.PREPAID,
    description: str = "",
    expires_at: datetime | None = None,
    actor=None,
    now: datetime | None = None,
) -> CreditGrant:
    """Give a tenant credit; the next finalizations use it."""
    try:
        amount = Decimal(amount)
    except (ArithmeticError, TypeError, ValueError):
        raise ValidationError({"amount": "Give an amount such as 25.00."}) from None
    if not amount.is_finite() or amount <= 0 or round_to_cents(amount) != amount:
        raise ValidationError({"amount": "Give a positive amount in whole cents."})
    if kind not in CreditGrant.Kind.values:
        raise ValidationError({"kind": f"Choose one of {', '.join(CreditGrant.Kind.values)}."})
    now = now or timezone.now()
    if expires_at is not None and expires_at <= now:
        raise ValidationError({"expires_at": "The expiry must be in the future."})
    grant = CreditGrant(
        tenant=tenant,
        kind=kind,
        amount=amount,
        remaining=amount,
        description=description[:200],
        granted_by=actor if getattr(actor, "pk", None) else None,
        granted_at=now,
        expires_at=expires_at,
    )
    grant.full_clean()
    grant.save()
    return grant


def available_credit(tenant: Tenant) -> Decimal:
    now = timezone.now()
    total = (
        CreditGrant.objects.filter(tenant=tenant, remaining__gt=0)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .aggregate(total=Sum("remaining"))["total"]
    )
    return round_to_cents(total or ZERO)


# --- documents ---------------------------------------------------------------------------


def draft_totals(figure: SoFar) -> InvoiceTotals:
    """A draft's totals for its month so far (no credits yet: they apply at finalization),
    the totals its document shows for the same moment."""
    return invoice_totals([figure.amount], tax_rate=configured_tax_rate())


def with_so_far(rows: Iterable[Invoice], now: datetime | None = None) -> list[Invoice]:
    """``rows`` with each draft's month so far as of ``now`` (``draft.so_far``, a
    ``SoFar``, and ``draft.so_far_totals``), rated for all drafts of a month at once: what
    lists (the tenant's, the admin's, the API's) show for a draft instead of its stored
    zeros."""
    now = now or timezone.now()
    rows = list(rows)
    drafts: dict[date, list[Invoice]] = defaultdict(list)
    for invoice in rows:
        if invoice.is_draft:
            drafts[invoice.month].append(invoice)
    for month, month_drafts in drafts.items():
        figures = so_far({draft.tenant_id for draft in month_drafts}, month, now)
        for draft in month_drafts:
            draft.so_far = figures[draft.tenant_id]
            draft.so_far_totals = draft_totals(draft.so_far)
    return rows


def draft_lines(invoice: Invoice, now: datetime | None = None) -> list[UsageLine]:
    return usage_report(invoice.tenant, invoice.month, now).lines


def document(invoice: Invoice, *, now: datetime | None = None) -> documents.Invoice:
    """The document of an invoice: stored for an issued one, the usage so far for a draft
    (its credits and number come at finalization)."""
    start, end = month_bounds(invoice.month)
    if invoice.is_draft:
        tenant = invoice.tenant
        lines = [
            documents.InvoiceLine(
                description=line.description,
                instance_name=line.instance_name,
                spec_code=line.spec_code,
                seconds=line.seconds,
                unit_price_per_hour=line.unit_price_per_hour,
                amount=line.amount,
            )
            for line in draft_lines(invoice, now)
        ]
        tax_rate = configured_tax_rate()
        totals = invoice_totals((line.amount for line in lines), tax_rate=tax_rate)
        return documents.Invoice(
            number=DRAFT_NUMBER,
            status=documents.InvoiceStatus.DRAFT,
            issuer=current_issuer(),
            tenant=documents.BillTo(name=tenant.name, slug=tenant.slug),
            period_start=start,
            period_end=end,
            issued_at=None,
            lines=tuple(lines),
            subtotal=totals.subtotal,
            credits_applied=totals.credits_applied,
            tax_rate=tax_rate,
            tax_amount=totals.tax,
            total=totals.total,
            currency=invoice.currency,
        )
    stored = getattr(invoice, "_prefetched_objects_cache", {}).get("lines")
    rows = list(stored) if stored is not None else list(invoice.lines.order_by("position"))
    return documents.Invoice(
        number=invoice.number,
        status=documents.InvoiceStatus(invoice.status),
        issuer=documents.Issuer(
            name=invoice.issuer_name,
            address_lines=tuple(invoice.issuer_address or ()),
            tax_id=invoice.issuer_tax_id or None,
        ),
        tenant=documents.BillTo(name=invoice.tenant_name, slug=invoice.tenant_slug),
        period_start=start,
        period_end=end,
        issued_at=invoice.issued_at,
        lines=tuple(
            documents.InvoiceLine(
                description=row.description,
                instance_name=row.instance_name,
                spec_code=row.spec_code,
                seconds=row.seconds,
                unit_price_per_hour=row.unit_price_per_hour,
                amount=row.amount,
            )
            for row in rows
        ),
        subtotal=invoice.subtotal,
        credits_applied=invoice.credits_applied,
        tax_rate=invoice.tax_rate,
        tax_amount=invoice.tax_amount,
        total=invoice.total,
        currency=invoice.currency,
        document=invoice.kind,
        corrects=invoice.corrects.number if invoice.corrects_id else None,
    )


@dataclass(frozen=True)
class Export:
    content: bytes
    content_type: str
    filename: str


EXPORT_FORMATS = {
    "csv": "text/csv; charset=utf-8",
    "json": "application/json",
    "pdf": "application/pdf",
}


def export_basename(invoice: Invoice) -> str:
    prefix = "credit-note" if invoice.is_credit_note else "invoice"
    if invoice.number:
        return f"{prefix}-{invoice.number}"
    return f"{prefix}-draft-{invoice.tenant.slug}-{invoice.month:%Y-%m}"


def render(doc: documents.Invoice, fmt: str, *, credit_note: bool = False) -> bytes:
    if fmt == "csv":
        return documents.render_invoice_csv(doc).encode()
    if fmt == "json":
        return documents.render_invoice_json(doc).encode()
    if fmt == "pdf":
        return documents.render_invoice_pdf(doc, title="Credit note" if credit_note else "Invoice")
    raise ValueError(f"unknown format {fmt!r}")


def export(invoice: Invoice, fmt: str, *, now: datetime | None = None) -> Export:
    """One invoice as CSV, JSON or PDF, with its content type and a file name."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown format {fmt!r}")
    content = render(document(invoice, now=now), fmt, credit_note=invoice.is_credit_note)
    return Export(content, EXPORT_FORMATS[fmt], f"{export_basename(invoice)}.{fmt}")


def issued(month: date | None = None) -> QuerySet:
    """Issued invoices and credit notes (of ``month``), numbers in order, lines prefetched."""
    invoices = Invoice.objects.exclude(status=Invoice.Status.DRAFT)
    if month is not None:
        invoices = invoices.filter(month=month)
    return (
        invoices.order_by("number")
        .select_related("corrects")
        .prefetch_related(
            Prefetch("lines", queryset=InvoiceLine.objects.order_by("invoice_id", "position"))
        )
    )


def month_export_csv(invoices: Iterable[Invoice]) -> str:
    """The operators' export of the given issued invoices and credit notes: their lines and
    totals (``documents.render_month_export_csv``)."""
    return documents.render_month_export_csv(
        document(invoice) for invoice in invoices if not invoice.is_draft
    )


def pdf_zip(invoices: Iterable[Invoice]) -> bytes:
    """A ZIP with one PDF per given issued invoice."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for invoice in invoices:
            if invoice.is_draft:
                continue
            pdf = render(document(invoice), "pdf", credit_note=invoice.is_credit_note)
            info = zipfile.ZipInfo(
                f"{export_basename(invoice)}.pdf", date_time=(1980, 1, 1, 0, 0, 0)
            )
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, pdf)
    return buffer.getvalue()
