"""API representations of usage and invoices. Amounts are decimal strings: usage at 6
places, invoice totals in cents."""

from datetime import datetime

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing.exports import document, with_so_far
from billing.issuing import configured_tax_rate
from billing.models import Invoice
from billing.usage import MONTH_PATTERN, parse_month


@extend_schema_field({"type": "string", "pattern": MONTH_PATTERN, "example": "2026-11"})
class MonthField(serializers.DateField):
    """A UTC month, written YYYY-MM."""

    def __init__(self, **kwargs):
        super().__init__(format="%Y-%m", **kwargs)


class MonthQuerySerializer(serializers.Serializer):
    month = serializers.CharField(
        required=False, trim_whitespace=False, help_text="YYYY-MM (UTC); default: now"
    )

    def validate_month(self, value):
        try:
            return parse_month(value)
        except ValueError as error:
            raise serializers.ValidationError(str(error)) from None

    def validate(self, attrs):
        # DRF reads an empty query value as "not given"; `?month=` is a month that is not one
        if self.initial_data.get("month", None) == "":
            raise serializers.ValidationError({"month": ["Use the form YYYY-MM, e.g. 2026-05."]})
        return attrs


class ExportQuerySerializer(serializers.Serializer):
    format = serializers.ChoiceField(choices=["csv", "json", "pdf"], default="pdf")


def draft_so_far(invoice):
    """A draft's month so far (``exports.with_so_far``), computed once per invoice object
    unless its list computed it already."""
    if not hasattr(invoice, "so_far"):
        with_so_far([invoice])
    return invoice.so_far


def _amount(**kwargs):
    return serializers.DecimalField(max_digits=24, decimal_places=6, read_only=True, **kwargs)


def _gib():
    """Storage: the GiB billed, every digit (amount = gib × seconds / month_seconds × price
    per GiB-month, rounded once to 6 places)."""
    return serializers.DecimalField(
        max_digits=60, decimal_places=30, read_only=True, allow_null=True, normalize_output=True
    )


def _month_seconds():
    return serializers.IntegerField(
        read_only=True, allow_null=True, help_text="storage: the seconds of its UTC month"
    )


def _cents(**kwargs):
    return serializers.DecimalField(max_digits=16, decimal_places=2, read_only=True, **kwargs)


class InstanceRefSerializer(serializers.Serializer):
    id = serializers.IntegerField(source="instance_id")
    name = serializers.CharField(source="instance_name")


class UsageLineSerializer(serializers.Serializer):
    kind = serializers.CharField()
    instance = InstanceRefSerializer(source="*")
    spec = serializers.CharField(source="spec_code")
    description = serializers.CharField()
    seconds = serializers.IntegerField()
    price_per_hour = _amount(source="unit_price_per_hour", allow_null=True, help_text="GPU time")
    gib = _gib()
    month_seconds = _month_seconds()
    price_per_gib_month = _amount(source="unit_price_per_gib_month", allow_null=True)
    amount = _amount()


class BreakdownSerializer(serializers.Serializer):
    key = serializers.CharField()
    label = serializers.CharField()
    seconds = serializers.IntegerField()
    amount = _amount()


class DaySerializer(serializers.Serializer):
    date = serializers.DateField()
    amount = _amount()


class AccruingSerializer(serializers.Serializer):
    kind = serializers.CharField()
    instance = InstanceRefSerializer(source="*")
    spec = serializers.CharField(source="spec_code")
    since = serializers.DateTimeField()
    per_hour = _amount()


class UsageReportSerializer(serializers.Serializer):
    month = MonthField()
    currency = serializers.SerializerMethodField()
    period_start = serializers.DateTimeField()
    period_end = serializers.DateTimeField()
    as_of = serializers.DateTimeField(source="now")
    lines = UsageLineSerializer(many=True)
    total = _amount(help_text="the lines' sum, 6 places")
    rate_per_hour = _amount(help_text="what accrues now, per hour")
    forecast = _amount(allow_null=True, help_text="month end projection (current month)")
    accruing = AccruingSerializer(many=True)
    by_instance = BreakdownSerializer(many=True)
    by_spec = BreakdownSerializer(many=True)
    daily = DaySerializer(many=True)

    def get_currency(self, report) -> str:
        return self.context["currency"]


class InvoiceLineSerializer(serializers.Serializer):
    description = serializers.CharField()
    instance = serializers.CharField(source="instance_name")
    spec = serializers.CharField(source="spec_code")
    seconds = serializers.IntegerField()
    price_per_hour = _amount(source="unit_price_per_hour", allow_null=True, help_text="GPU time")
    gib = _gib()
    month_seconds = _month_seconds()
    price_per_gib_month = _amount(source="unit_price_per_gib_month", allow_null=True)
    amount = _amount()


class InvoiceSerializer(serializers.ModelSerializer):
    """An invoice or credit note. A draft shows the month's usage so far (no number yet;
    credits apply at finalization)."""

    month = MonthField()
    period_start = serializers.DateTimeField()
    period_end = serializers.DateTimeField()
    subtotal = _cents()
    credits_applied = _cents()
    tax_rate = serializers.DecimalField(
        max_digits=7, decimal_places=6, read_only=True, allow_null=True, normalize_output=True
    )
    tax_amount = _cents()
    total = _cents()
    credit_note = serializers.SerializerMethodField(help_text="a void invoice: its reversal")
    credit_notes = serializers.SerializerMethodField(
        help_text="every credit note against the invoice: its reversal, and those of late "
        "corrections"
    )
    exports = serializers.SerializerMethodField()
    as_of = serializers.SerializerMethodField(
        help_text="a draft: the moment its totals (the month so far) were computed; null once "
        "issued"
    )

    class Meta:
        model = Invoice
        fields = [
            "id",
            "number",
            "kind",
            "status",
            "month",
            "period_start",
            "period_end",
            "issued_at",
            "currency",
            "subtotal",
            "credits_applied",
            "tax_rate",
            "tax_amount",
            "total",
            "paid_at",
            "voided_at",
            "corrects",
            "credit_note",
            "credit_notes",
            "credits",
            "exports",
            "as_of",
        ]
        read_only_fields = fields

    def get_credit_note(self, invoice) -> int | None:
        if invoice.status != "void":
            return None
        notes = invoice.credit_notes.all()
        return next((note.pk for note in notes if note.credits == Invoice.Credits.VOID), None)

    def get_credit_notes(self, invoice) -> list[int]:
        return sorted(note.pk for note in invoice.credit_notes.all())

    def get_exports(self, invoice) -> dict[str, str]:
        request = self.context.get("request")
        path = f"/api/v1/invoices/{invoice.pk}/export/"
        base = request.build_absolute_uri(path) if request else path
        return {fmt: f"{base}?format={fmt}" for fmt in ("csv", "json", "pdf")}

    def get_as_of(self, invoice) -> datetime | None:
        if not invoice.is_draft:
            return None
        return serializers.DateTimeField().to_representation(invoice.so_far.as_of)

    def to_representation(self, invoice):
        if invoice.is_draft:
            draft_so_far(invoice)
        data = super().to_representation(invoice)
        if invoice.is_draft:
            totals = invoice.so_far_totals
            data["subtotal"] = f"{totals.subtotal:.2f}"
            data["credits_applied"] = f"{totals.credits_applied:.2f}"
            data["tax_amount"] = f"{totals.tax:.2f}"
            data["total"] = f"{totals.total:.2f}"
            tax_rate = configured_tax_rate()
            data["tax_rate"] = None if tax_rate is None else f"{tax_rate.normalize():f}"
        return data


class InvoiceDetailSerializer(InvoiceSerializer):
    lines = serializers.SerializerMethodField()

    class Meta(InvoiceSerializer.Meta):
        fields = [*InvoiceSerializer.Meta.fields, "lines"]
        read_only_fields = fields

    def get_lines(self, invoice) -> list[dict]:
        if invoice.is_draft:
            lines = document(invoice, now=invoice.so_far.as_of).lines
        else:
            lines = invoice.lines.order_by("position")
        return InvoiceLineSerializer(lines, many=True).data
