"""Operators' billing: invoices (mark paid, void with a credit note, month exports), credit
grants, and read-only views of segments and budget alerts. Every change goes through the
services; issued invoices are never edited here."""

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.http import HttpResponse, HttpResponseBadRequest
from django.urls import path
from django.utils.html import format_html

from billing import exports, services
from billing.models import BudgetAlert, CreditGrant, Invoice, InvoiceLine, UsageSegment
from billing.money import format_money
from billing.usage import parse_month


class ReadOnlyMixin:
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class InvoiceLineInline(ReadOnlyMixin, admin.TabularInline):
    model = InvoiceLine
    extra = 0
    fields = ["position", "description", "instance_name", "spec_code", "seconds",
              "unit_price_per_hour", "amount"]  # fmt: skip
    readonly_fields = fields


class MonthFilter(admin.SimpleListFilter):
    title = "month"
    parameter_name = "month"

    def lookups(self, request, model_admin):
        months = Invoice.objects.order_by("-month").values_list("month", flat=True).distinct()
        return [(f"{month:%Y-%m}", f"{month:%B %Y}") for month in months[:36]]

    def queryset(self, request, queryset):
        if self.value():
            try:
                return queryset.filter(month=parse_month(self.value()))
            except ValueError:
                return queryset.none()
        return queryset


def _attachment(content, content_type: str, filename: str) -> HttpResponse:
    response = HttpResponse(content, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@admin.register(Invoice)
class InvoiceAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["__str__", "tenant", "kind", "month", "status", "shown_total", "issued_at",
                    "paid_at"]  # fmt: skip
    list_filter = [MonthFilter, "status", "kind"]
    search_fields = ["number", "tenant__slug", "tenant__name"]
    list_select_related = ["tenant"]
    inlines = [InvoiceLineInline]
    actions = ["mark_paid", "void", "export_csv", "export_pdfs"]
    change_list_template = "billing/admin/invoice_change_list.html"
    readonly_fields = [
        "tenant", "kind", "month", "status", "number", "issued_at", "currency", "issuer_name",
        "issuer_address", "issuer_tax_id", "tenant_name", "tenant_slug", "subtotal",
        "credits_applied", "tax_rate", "tax_amount", "shown_total", "paid_at", "voided_at",
        "void_reason", "corrects", "created_at",
    ]  # fmt: skip

    def get_urls(self):
        return [
            path(
                "export/",
                self.admin_site.admin_view(self.export_month_view),
                name="billing_invoice_export",
            ),
            *super().get_urls(),
        ]

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        changelist.result_list = exports.with_so_far(changelist.result_list)
        return changelist

    @admin.display(description="total")
    def shown_total(self, invoice):
        """An issued invoice's total; a draft's month so far (what its tenant sees now)."""
        if not invoice.is_draft:
            return format_money(invoice.total, invoice.currency)
        figure = getattr(invoice, "so_far", None) or exports.with_so_far([invoice])[0].so_far
        return format_html(
            '{} <span class="help" title="the month so far, as of {} UTC">so far at {}</span>',
            format_money(exports.draft_totals(figure).total, invoice.currency),
            f"{figure.as_of:%Y-%m-%d %H:%M:%S}",
            f"{figure.as_of:%H:%M} UTC",
        )

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), "export_month": request.GET.get("month")}
        return super().changelist_view(request, extra_context)

    def export_month_view(self, request):
        """Every issued invoice (and credit note) of ?month=YYYY-MM, as one CSV or a ZIP."""
        if not self.has_view_permission(request):
            return HttpResponse(status=403)
        try:
            month = parse_month(request.GET.get("month", ""))
        except ValueError as error:
            return HttpResponseBadRequest(str(error))
        chosen = exports.issued(month)
        if request.GET.get("format") == "zip":
            return _attachment(
                exports.pdf_zip(chosen), "application/zip", f"invoices-{month:%Y-%m}.zip"
            )
        return _attachment(
            exports.month_export_csv(chosen), "text/csv; charset=utf-8",
            f"invoices-{month:%Y-%m}.csv",
        )  # fmt: skip

    @admin.action(description="Mark selected invoices paid")
    def mark_paid(self, request, queryset):
        done = 0
        for invoice in queryset.order_by("pk"):
            try:
                services.mark_paid(invoice, actor=request.user)
                done += 1
            except services.InvalidInvoiceState as error:
                self.message_user(request, f"{invoice}: {error.detail}", messages.WARNING)
        self.message_user(request, f"{done} invoice(s) marked paid.", messages.SUCCESS)

    @admin.action(description="Void selected invoices (issues credit notes)")
    def void(self, request, queryset):
        for invoice in queryset.order_by("pk"):
            try:
                note = services.void_invoice(
                    invoice, actor=request.user, reason=f"voided by {request.user.username}"
                )
            except services.InvalidInvoiceState as error:
                self.message_user(request, f"{invoice}: {error.detail}", messages.WARNING)
            else:
                self.message_user(request, f"{invoice} voided; credit note {note.number}.")

    @admin.action(description="Export selected issued invoices as one CSV")
    def export_csv(self, request, queryset):
        chosen = exports.issued().filter(pk__in=queryset.values("pk"))
        return _attachment(
            exports.month_export_csv(chosen), "text/csv; charset=utf-8", "invoices.csv"
        )

    @admin.action(description="Export selected issued invoices as PDFs (ZIP)")
    def export_pdfs(self, request, queryset):
        chosen = exports.issued().filter(pk__in=queryset.values("pk"))
        return _attachment(exports.pdf_zip(chosen), "application/zip", "invoices.zip")


@admin.register(CreditGrant)
class CreditGrantAdmin(admin.ModelAdmin):
    list_display = ["tenant", "kind", "amount", "remaining", "granted_at", "expires_at",
                    "granted_by"]  # fmt: skip
    list_filter = ["kind"]
    search_fields = ["tenant__slug", "tenant__name", "description"]
    list_select_related = ["tenant", "granted_by"]
    fields = ["tenant", "kind", "amount", "description", "expires_at"]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        return [*self.fields, "remaining", "granted_at", "granted_by"]

    def get_fields(self, request, obj=None):
        return self.get_readonly_fields(request, obj) or self.fields

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        if change:
            return
        try:
            grant = services.grant_credit(
                obj.tenant,
                obj.amount,
                kind=obj.kind,
                description=obj.description,
                expires_at=obj.expires_at,
                actor=request.user,
            )
        except ValidationError as error:
            raise ValidationError(error.messages) from None
        obj.pk = grant.pk
        obj.remaining = grant.remaining
        obj.granted_at = grant.granted_at
        obj.granted_by = grant.granted_by


@admin.register(UsageSegment)
class UsageSegmentAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["instance", "tenant", "kind", "spec", "started_at", "ended_at", "rated",
                    "source"]  # fmt: skip
    list_filter = ["kind", "rated", "source"]
    search_fields = ["instance__name", "tenant__slug"]
    list_select_related = ["instance", "tenant", "spec"]
    date_hierarchy = "started_at"


@admin.register(BudgetAlert)
class BudgetAlertAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["tenant", "month", "threshold", "spent", "budget", "created_at", "emailed_at"]
    list_filter = ["threshold", "month"]
    search_fields = ["tenant__slug"]
    list_select_related = ["tenant"]
