"""REST API of billing: /api/v1/usage/ and /api/v1/invoices/… (the tenant's own only)."""

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import request_membership
from accounts.roles import READ
from billing import exports
from billing.models import Invoice
from billing.serializers import (
    ExportQuerySerializer,
    InvoiceDetailSerializer,
    InvoiceSerializer,
    MonthQuerySerializer,
    UsageReportSerializer,
)
from billing.usage import MONTH_PATTERN, current_month, usage_report

MONTH_PARAM = OpenApiParameter(
    "month", str, pattern=MONTH_PATTERN, description="YYYY-MM (UTC); default: this month"
)


class UsageView(APIView):
    """The tenant's usage in a month: lines (instance, spec, seconds, price per hour,
    amount), per instance, per spec, per day, what accrues now and the month-end forecast."""

    read_role = READ
    api_scopes = "billing:read"

    @extend_schema(parameters=[MONTH_PARAM], responses=UsageReportSerializer)
    def get(self, request):
        query = MonthQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        tenant = request_membership(request).tenant
        month = query.validated_data.get("month") or current_month()
        report = usage_report(tenant, month)
        context = {"request": request, "currency": settings.BILLING_CURRENCY}
        return Response(UsageReportSerializer(report, context=context).data)


class ExportNegotiation(DefaultContentNegotiation):
    """``?format=`` names the export's format here, not a renderer: answer errors as JSON."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class InvoiceViewSet(viewsets.ReadOnlyModelViewSet):
    """The tenant's invoices and credit notes, newest first; drafts show the month so far."""

    read_role = READ
    api_scopes = "billing:read"
    queryset = Invoice.objects.none()  # typed path parameters in the schema

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Invoice.objects.none()
        tenant = request_membership(self.request).tenant
        return (
            Invoice.objects.filter(tenant=tenant)
            .select_related("tenant")
            .prefetch_related("credit_notes")
            .order_by("-month", "-pk")
        )

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        return None if page is None else exports.with_so_far(page)

    def get_serializer_class(self):
        return InvoiceDetailSerializer if self.action == "retrieve" else InvoiceSerializer

    def get_content_negotiator(self):
        if getattr(self, "action", None) == "export":
            return ExportNegotiation()
        return super().get_content_negotiator()

    @extend_schema(
        parameters=[
            OpenApiParameter("format", str, enum=["csv", "json", "pdf"], description="default pdf")
        ],
        responses={
            (200, "text/csv"): OpenApiTypes.STR,
            (200, "application/json"): OpenApiTypes.OBJECT,
            (200, "application/pdf"): OpenApiTypes.BINARY,
        },
    )
    @action(detail=True, methods=["get"])
    def export(self, request, pk=None):
        """Download the invoice as CSV, JSON or PDF."""
        invoice = self.get_object()
        query = ExportQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return download(exports.export(invoice, query.validated_data["format"]))


def download(export: exports.Export) -> HttpResponse:
    response = HttpResponse(export.content, content_type=export.content_type)
    response["Content-Disposition"] = f'attachment; filename="{export.filename}"'
    response["Cache-Control"] = "private, no-store"
    return response
