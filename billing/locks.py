"""Row locks of billing's tables, last in the order (accounts/locks.py), each kind in
primary-key order: budget alerts, invoice sequences, invoices, credit grants, usage
segments."""

from django.db.models import QuerySet

from billing.models import BudgetAlert, CreditGrant, Invoice, InvoiceSequence


def unsent_alert(pk: int) -> BudgetAlert | None:
    """The alert, with its tenant's quota, while its email has not gone out (None once it has)."""
    return (
        BudgetAlert.objects.select_for_update(of=("self",))
        .select_related("tenant__quota")
        .filter(pk=pk, emailed_at__isnull=True)
        .first()
    )


def invoice_sequence(series: str, year: int) -> InvoiceSequence:
    """The series' row for ``year``, created if need be (always two statements, so that
    finalization's query count does not depend on it)."""
    InvoiceSequence.objects.bulk_create(
        [InvoiceSequence(series=series, year=year)], ignore_conflicts=True
    )
    return InvoiceSequence.objects.select_for_update().get(series=series, year=year)


def invoice(pk: int) -> Invoice:
    return Invoice.objects.select_for_update().get(pk=pk)


def invoices(queryset: QuerySet) -> QuerySet:
    return queryset.select_for_update(of=("self",)).order_by("pk")


def credit_grants(queryset: QuerySet) -> list[CreditGrant]:
    return list(queryset.select_for_update().order_by("pk"))


def segments(queryset: QuerySet) -> QuerySet:
    """Usage segments (a queryset of UsageSegment)."""
    return queryset.select_for_update(of=("self",)).order_by("pk")
