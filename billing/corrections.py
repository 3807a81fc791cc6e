"""What happens to an issued invoice: it is paid, or voided, or a late correction takes back
some of it. A void invoice is never edited; a credit note (its own number, in the ``CN``
series) reverses it exactly. A late correction that takes money back is a credit note too,
against the invoice it corrects, issued when the month it was found in is finalized."""

import logging
from collections import defaultdict
from datetime import date, datetime

from django.db import transaction
from django.utils import timezone

from billing import locks
from billing.issuing import CREDIT_NOTE_SERIES, format_number, invoice_line
from billing.models import CreditGrant, Invoice, InvoiceLine, UsageCorrection
from billing.rating import ZERO, InvoiceTotals, invoice_totals, reversed_totals, round_to_cents
from billing.usage import correction_key, corrections_of, grouped_corrections, make_line
from console.audit import recorder as audit
from console.errors import DomainError, ErrorCode

log = logging.getLogger(__name__)


class InvalidInvoiceState(DomainError):
    """The invoice is not in a state that allows this (answered as 409 invalid_state)."""

    code = ErrorCode.INVALID_STATE


PAID_BEFORE = {"status": Invoice.Status.FINALIZED}
PAID_AFTER = {"status": Invoice.Status.PAID}


def mark_paid(invoice: Invoice, *, actor=None, now: datetime | None = None) -> Invoice:
    """finalized → paid. Marking a paid invoice paid again changes nothing."""
    now = now or timezone.now()
    with transaction.atomic():
        changed = Invoice.objects.filter(
            pk=invoice.pk, kind=Invoice.Kind.INVOICE, status=Invoice.Status.FINALIZED
        ).update(status=Invoice.Status.PAID, paid_at=now)
        current = Invoice.objects.get(pk=invoice.pk)
        if changed:
            audit.record("invoice.mark_paid", current, before=PAID_BEFORE, after=PAID_AFTER)
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
            return Invoice.objects.get(corrects=original, credits=Invoice.Credits.VOID)
        if original.status == Invoice.Status.DRAFT:
            raise InvalidInvoiceState("A draft is not issued yet, so it cannot be voided.")
        if original.nothing_to_pay:
            raise InvalidInvoiceState("A month with nothing to pay has nothing to void.")
        _return_credits(original)
        sequence.last_number += 1
        sequence.save(update_fields=["last_number"])
        number = format_number(CREDIT_NOTE_SERIES, now.year, sequence.last_number)
        note = _issue_credit_note(original, number, now)
        Invoice.objects.filter(pk=original.pk).update(
            status=Invoice.Status.VOID, voided_at=now, void_reason=reason[:200]
        )
        audit.record(
            "invoice.void",
            original,
            before={"status": original.status},
            after={"status": Invoice.Status.VOID, "reason": reason, "credit_note": number},
        )
    log.warning(
        "invoice %s voided by %s (%s); credit note %s",
        original.number,
        getattr(actor, "username", "system"),
        reason,
        note.number,
    )
    return note


def _return_credits(original: Invoice) -> None:
    """The credits ``original`` used go back to their grants (locked in pk order)."""
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


def _issue_credit_note(original: Invoice, number: str, now: datetime) -> Invoice:
    """The credit note ``number`` that reverses ``original``: its lines and totals negated,
    net of what its corrections' credit notes already took back (their lines negated too),
    its issuer, tenant and tax rate as they were on ``original``."""
    corrected = list(original.credit_notes.filter(credits=Invoice.Credits.CORRECTION))
    totals = reversed_totals(
        InvoiceTotals(
            subtotal=original.subtotal + sum((note.subtotal for note in corrected), ZERO),
            credits_applied=original.credits_applied,
            credit_remaining=ZERO,
            tax=original.tax_amount + sum((note.tax_amount for note in corrected), ZERO),
            total=original.total + sum((note.total for note in corrected), ZERO),
        )
    )
    note = _credit_note(original, number, totals, Invoice.Credits.VOID, now)
    InvoiceLine.objects.bulk_create(
        InvoiceLine(
            invoice=note,
            position=position,
            description=f"Reversal of {original.number}: {line.description}"[:300],
            instance_name=line.instance_name,
            spec_code=line.spec_code,
            seconds=line.seconds,
            unit_price_per_hour=line.unit_price_per_hour,
            storage_bytes=line.storage_bytes,
            month_seconds=line.month_seconds,
            unit_price_per_gib_month=line.unit_price_per_gib_month,
            amount=-line.amount,
        )
        for position, line in enumerate(
            InvoiceLine.objects.filter(invoice__in=[original, *corrected]).order_by(
                "invoice_id", "position"
            ),
            start=1,
        )
    )
    return note


def issue_correction_notes(month: date, sequence, now: datetime) -> list[int]:
    """Within finalization (``sequence``: the ``CN`` series, locked): a credit note for every
    issued invoice whose corrections found in ``month`` take money back and have no note yet,
    numbered in pk order of the invoices. Its lines are the corrections, grouped as on an
    invoice; its tax is at the corrected invoice's rate; no credit is used. Answers the notes'
    pks; run again, it finds nothing to credit."""
    tenants = UsageCorrection.objects.filter(month=month).values("tenant_id")
    pending = corrections_of(tenants, month, credited=True).filter(credit_note__isnull=True)
    lines = defaultdict(list)
    for row in grouped_corrections(pending, "corrects_id"):
        line = make_line(
            correction_key(row),
            month=month,
            instance_name=row["instance__name"],
            spec_code=row["spec__code"],
            spec_name=row["spec__name"],
            seconds=int(row["total_seconds"]),
            amount_micros=int(row["micros"]),
        )
        lines[row["corrects_id"]].append(line)
    notes = []
    for original in locks.invoices(Invoice.objects.filter(pk__in=lines)):
        note_lines = sorted(lines[original.pk], key=lambda line: line.sort_key)
        number = None  # a note of 0.00: nothing to pay back, no number
        if round_to_cents(sum((line.amount for line in note_lines), ZERO)):
            sequence.last_number += 1
            number = format_number(CREDIT_NOTE_SERIES, now.year, sequence.last_number)
        notes.append(_correction_note(original, number, note_lines, now))
        pending.filter(corrects=original).update(credit_note=notes[-1])
    if notes:
        sequence.save(update_fields=["last_number"])
        audit.record_all(
            [
                audit.entry(
                    "invoice.credit",
                    note.corrects,
                    after={"credit_note": note.number, "total": note.total},
                )
                for note in notes
            ]
        )
    return [note.pk for note in notes]


def _credit_note(
    original: Invoice, number: str | None, totals: InvoiceTotals, credits: str, now: datetime
) -> Invoice:
    """A credit note of ``totals`` against ``original`` (``credits``: what for), with its
    issuer, tenant and tax rate as they were on ``original``."""
    return Invoice.objects.create(
        tenant_id=original.tenant_id,
        kind=Invoice.Kind.CREDIT_NOTE,
        credits=credits,
        month=original.month,
        status=Invoice.Status.FINALIZED,
        number=number,
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


def _correction_note(original: Invoice, number: str | None, lines, now: datetime) -> Invoice:
    totals = invoice_totals((line.amount for line in lines), tax_rate=original.tax_rate)
    note = _credit_note(original, number, totals, Invoice.Credits.CORRECTION, now)
    InvoiceLine.objects.bulk_create(
        invoice_line(note.pk, position, line) for position, line in enumerate(lines, start=1)
    )
    return note
