"""Console pages: usage (with the budget form for owners), invoices and downloads."""

from datetime import date, timedelta

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from accounts.guards import tenant_view
from accounts.roles import BILLING, READ
from billing import budgets, credits, exports, services
from billing.api import download
from billing.forms import BudgetForm
from billing.models import Invoice
from billing.usage import current_month, parse_month, usage_report
from console import integers


def _month_param(request) -> date:
    text = request.GET.get("month")
    if not text:
        return current_month()
    try:
        return parse_month(text)
    except ValueError as error:
        messages.error(request, f"Month {text!r}: {error}")
        return current_month()


def _shift(month: date, months: int) -> date:
    index = month.year * 12 + month.month - 1 + months
    return date(index // 12, index % 12 + 1, 1)


@tenant_view(READ, write_needed=BILLING)
def usage(request):
    membership = request.membership
    tenant = membership.tenant
    quota = tenant.quota
    can_edit = membership.can(BILLING)
    form = BudgetForm(request.POST or None, instance=quota, prefix="budget")
    if request.method == "POST" and form.is_valid():
        try:
            services.set_budget(
                tenant,
                form.cleaned_data["monthly_budget"],
                form.cleaned_data["budget_action"],
                actor=request.user,
            )
        except ValidationError as error:
            for field, errors in error.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        else:
            messages.success(request, "Budget saved.")
            return redirect(reverse("billing:usage"))
    now = timezone.now()
    month = _month_param(request)
    report = usage_report(tenant, month, now)
    this_month = current_month(now)
    spent = report.total if month == this_month else budgets.month_to_date(tenant, now)
    budget = quota.monthly_budget
    percent = int(spent * 100 / budget) if budget else None
    invoice = Invoice.objects.filter(tenant=tenant, kind=Invoice.Kind.INVOICE, month=month).first()
    return render(
        request,
        "billing/usage.html",
        {
            "report": report,
            "month": month,
            "previous_month": _shift(month, -1),
            "next_month": _shift(month, 1) if month < this_month else None,
            "form": form,
            "can_edit": can_edit,
            "quota": quota,
            "spent": spent,
            "budget_percent": percent,
            "invoice": invoice,
            "minimum_seconds": settings.BILLING_MINIMUM_SECONDS,
            "daily": [
                {"date": day.date.isoformat(), "amount": f"{day.amount:f}"} for day in report.daily
            ],
            "available_credit": credits.available_credit(tenant),
        },
    )


@require_POST
@tenant_view(READ, write_needed=READ)
def dismiss_budget_notice(request):
    """Any member hides the budget banner for the level it saw (budgets.dismiss_notice), then
    goes back to the page it was on."""
    try:
        level = integers.parse(request.POST.get("level", ""))
    except integers.NotAWholeNumber:
        level = 0
    budgets.dismiss_notice(request.membership, level)
    back = request.POST.get("next") or ""
    if not url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure()):
        back = reverse("dashboard")
    return redirect(back)


@tenant_view(READ)
def invoice_list(request):
    tenant = request.membership.tenant
    rows = exports.with_so_far(
        Invoice.objects.filter(tenant=tenant)
        .select_related("tenant", "corrects")
        .prefetch_related("credit_notes")
        .order_by("-month", "-pk")
    )
    return render(
        request,
        "billing/invoices.html",
        {
            "invoices": rows,
            "available_credit": credits.available_credit(tenant),
        },
    )


def _tenant_invoice(request, pk: int) -> Invoice:
    return get_object_or_404(
        Invoice.objects.select_related("tenant", "corrects"),
        pk=pk,
        tenant=request.membership.tenant,
    )


@tenant_view(READ)
def invoice_detail(request, pk: int):
    invoice = _tenant_invoice(request, pk)
    now = timezone.now()
    doc = exports.document(invoice, now=now)
    notes = list(invoice.credit_notes.order_by("pk"))
    credit_note = next((note for note in notes if note.credits == Invoice.Credits.VOID), None)
    return render(
        request,
        "billing/invoice.html",
        {
            "invoice": invoice,
            "doc": doc,
            "as_of": now,
            "credit_note": credit_note,
            "corrected_by": [note for note in notes if note.credits == Invoice.Credits.CORRECTION],
            "usage_link": f"{reverse('billing:usage')}?month={invoice.month:%Y-%m}",
            "last_day": invoice.period_end - timedelta(days=1),
        },
    )


@tenant_view(READ)
def invoice_download(request, pk: int, fmt: str):
    return download(exports.export(_tenant_invoice(request, pk), fmt))
