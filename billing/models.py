"""Billing data: usage segments and their rated pieces, invoices and their lines, credits,
invoice number sequences and budget alerts.

Money is ``Decimal``. The one exception is ``UsagePiece.amount_micros``: the amount of a
piece as an integer number of millionths (the 6-place ``Decimal`` times 10^6), so that the
database sums pieces exactly on every backend (SQLite would sum a decimal column as floats).
``UsagePiece.amount`` gives it back as a ``Decimal``.
"""

from datetime import UTC, date, datetime
from decimal import Context, Decimal

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from accounts.models import Membership, Tenant
from billing.documents import InvoiceStatus
from billing.rating import next_month_start
from console.catalog.models import Spec
from console.instances.models import Instance

MICROS = Decimal(1_000_000)
GIB = Decimal(1024**3)
_EXACT = Context(prec=60)  # a GiB figure of bytes has up to 30 decimal places


def bytes_to_gib(count: int) -> Decimal:
    """Bytes as GiB, every digit (2^-30 has 30 decimal places)."""
    return _EXACT.divide(Decimal(count), GIB).normalize(_EXACT)


def gib_to_bytes(gib: Decimal | int) -> int:
    return int((Decimal(gib) * GIB).to_integral_value())


def micros_to_decimal(micros: int | None) -> Decimal:
    """An integer number of millionths as a 6-place Decimal."""
    return (Decimal(micros or 0) / MICROS).quantize(Decimal("0.000001"))


def decimal_to_micros(amount: Decimal) -> int:
    micros = amount * MICROS
    if micros != micros.to_integral_value():
        raise ValueError(f"{amount} has more than 6 decimal places")
    return int(micros)


def month_bounds(month: date) -> tuple[datetime, datetime]:
    """[start, end) of a UTC month given as the date of its first day."""
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    return start, next_month_start(start)


class UsageKind(models.TextChoices):
    GPU = "gpu", "GPU time"
    DISK = "disk", "Disk while not running"
    VOLUME = "volume", "Volume"  # a tenant's volume, from creation to deletion (storage.py)
    SNAPSHOT = "snapshot", "Snapshot storage"  # a snapshot's stored data, while kept (storage.py)


class UsageSegment(models.Model):
    """A span of billable time of one instance: running (GPU) or stopped (disk).

    Opened when the instance enters the state and closed when it leaves it, by the
    receiver of ``instance_state_changed``, or by the meter's repair from the instance's
    event history. ``(instance, kind, started_at)`` is unique, so opening twice is a no-op.
    ``rated`` is True once the segment is closed and all its pieces are stored as final.
    """

    class Source(models.TextChoices):
        SIGNAL = "signal", "State change signal"
        REPAIR = "repair", "Repaired from the event history"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage_segments")
    instance = models.ForeignKey(Instance, on_delete=models.PROTECT, related_name="usage_segments")
    kind = models.CharField(max_length=8, choices=UsageKind.choices)
    spec = models.ForeignKey(Spec, on_delete=models.PROTECT, related_name="+")
    disk_gib = models.PositiveIntegerField(default=0, help_text="disk segments: the size")
    disk_price_per_gib_month = models.DecimalField(
        max_digits=12, decimal_places=6, null=True, blank=True
    )
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    # GPU segments: the run this one is part of, by the moment the tenant started it (launch,
    # start; None: older than this field, a run of its own), and the time the run ran in its
    # earlier segments (None: the run's first). A run is billed one minimum and one rounding
    # up, however it is split (billing.rating).
    run_started_at = models.DateTimeField(null=True, blank=True)
    run_before = models.DurationField(null=True, blank=True)
    rated = models.BooleanField(default=False)
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.SIGNAL)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["started_at", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["instance", "kind", "started_at"], name="one_segment_per_start"
            ),
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(ended_at__gte=F("started_at")),
                name="segment_ends_after_start",
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "started_at"], name="segment_tenant_start"),
            models.Index(
                fields=["instance", "kind"],
                condition=Q(ended_at__isnull=True),
                name="segment_open",
            ),
            models.Index(fields=["id"], condition=Q(rated=False), name="segment_unrated"),
        ]

    def __str__(self) -> str:
        end = self.ended_at.isoformat() if self.ended_at else "open"
        return f"{self.kind} of instance {self.instance_id}: {self.started_at.isoformat()} → {end}"


class UsagePiece(models.Model):
    """A rated part of a segment: one UTC month, one price (``billing.rating``).

    Keyed by ``(segment, start)``; the meter upserts them, so rating again changes nothing.
    Tenant, instance, spec, kind and disk size are copied from the segment so that
    finalization groups a month's pieces without a join.
    """

    segment = models.ForeignKey(UsageSegment, on_delete=models.CASCADE, related_name="pieces")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    instance = models.ForeignKey(Instance, on_delete=models.PROTECT, related_name="+")
    spec = models.ForeignKey(Spec, on_delete=models.PROTECT, related_name="+")
    kind = models.CharField(max_length=8, choices=UsageKind.choices)
    disk_gib = models.PositiveIntegerField(default=0)
    month = models.DateField(help_text="first day of the UTC month")
    start = models.DateTimeField()
    end = models.DateTimeField()
    unit_price = models.DecimalField(
        max_digits=18, decimal_places=6, help_text="per hour (GPU) or per GiB-month (disk)"
    )
    seconds = models.BigIntegerField()
    amount_micros = models.BigIntegerField(help_text="the amount in millionths")
    is_final = models.BooleanField(default=False)

    class Meta:
        ordering = ["segment", "start"]
        constraints = [
            models.UniqueConstraint(fields=["segment", "start"], name="one_piece_per_start")
        ]
        indexes = [models.Index(fields=["month", "tenant"], name="piece_month_tenant")]

    def __str__(self) -> str:
        return f"{self.kind} {self.month:%Y-%m} {self.seconds}s {self.amount}"

    @property
    def amount(self) -> Decimal:
        return micros_to_decimal(self.amount_micros)


class InvoiceSequence(models.Model):
    """The last number given in a series (GC invoices, CN credit notes) and year. Numbers
    are taken under this row's lock, in the transaction that issues the documents, so a
    rollback gives them back: no gaps."""

    series = models.CharField(max_length=8)
    year = models.PositiveIntegerField()
    last_number = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["series", "year"], name="one_sequence_per_year")
        ]

    def __str__(self) -> str:
        return f"{self.series}-{self.year}: {self.last_number}"


class Invoice(models.Model):
    """One tenant's invoice for one UTC month, or a credit note against one: it voids it
    (``credits`` void), or takes back what a late correction found was billed too much
    (``credits`` correction; ``finalize``).

    A draft has no number and no stored lines or totals: they are the month's usage so
    far. Finalization stores the lines, the totals, the issuer and tenant as they were, and
    gives the number (none when the subtotal is 0.00: nothing to pay); after that only the
    status moves on (paid, void), through services.
    """

    class Kind(models.TextChoices):
        INVOICE = "invoice", "Invoice"
        CREDIT_NOTE = "credit_note", "Credit note"

    class Status(models.TextChoices):
        DRAFT = InvoiceStatus.DRAFT.value, "Draft"
        FINALIZED = InvoiceStatus.FINALIZED.value, "Finalized"
        PAID = InvoiceStatus.PAID.value, "Paid"
        VOID = InvoiceStatus.VOID.value, "Void"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="invoices")
    kind = models.CharField(max_length=12, choices=Kind.choices, default=Kind.INVOICE)
    month = models.DateField(help_text="first day of the UTC month billed")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.DRAFT)
    number = models.CharField(max_length=32, unique=True, null=True, blank=True)
    issued_at = models.DateTimeField(null=True, blank=True)
    currency = models.CharField(max_length=3, default="USD")
    issuer_name = models.CharField(max_length=200, blank=True)
    issuer_address = models.JSONField(default=list, blank=True)
    issuer_tax_id = models.CharField(max_length=64, blank=True)
    tenant_name = models.CharField(max_length=120, blank=True)
    tenant_slug = models.CharField(max_length=50, blank=True)
    subtotal = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal("0.00"))
    credits_applied = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal("0.00"))
    tax_rate = models.DecimalField(max_digits=7, decimal_places=6, null=True, blank=True)
    tax_amount = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal("0.00"))
    total = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal("0.00"))
    paid_at = models.DateTimeField(null=True, blank=True)
    voided_at = models.DateTimeField(null=True, blank=True)
    void_reason = models.CharField(max_length=200, blank=True)

    class Credits(models.TextChoices):
        VOID = "void", "The whole invoice, voided"
        CORRECTION = "correction", "A late correction of its usage"

    corrects = models.ForeignKey(
        "self",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="credit_notes",
        help_text="credit notes: the invoice they credit",
    )
    credits = models.CharField(
        max_length=12, choices=Credits.choices, blank=True, help_text="credit notes: what for"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-month", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "month"],
                condition=Q(kind="invoice"),
                name="one_invoice_per_tenant_month",
            ),
        ]
        indexes = [models.Index(fields=["month", "status"], name="invoice_month_status")]

    def __str__(self) -> str:
        return self.number or f"Draft {self.month:%Y-%m} of {self.tenant_id}"

    @property
    def period_start(self) -> datetime:
        return month_bounds(self.month)[0]

    @property
    def period_end(self) -> datetime:
        return month_bounds(self.month)[1]

    @property
    def is_draft(self) -> bool:
        return self.status == self.Status.DRAFT

    @property
    def is_credit_note(self) -> bool:
        return self.kind == self.Kind.CREDIT_NOTE

    @property
    def nothing_to_pay(self) -> bool:
        """Issued with a subtotal of 0.00: no number, nothing to pay."""
        return not self.is_draft and not self.number


class InvoiceLine(models.Model):
    """A line of a finalized invoice or credit note, as issued (names copied). GPU time is
    priced per hour; storage (disk while not running, volumes, snapshots) per GiB-month,
    with its size and its month's seconds, so that its figures multiply to its amount."""

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    position = models.PositiveIntegerField()
    kind = models.CharField(max_length=8, choices=UsageKind.choices, blank=True)
    instance = models.ForeignKey(
        Instance, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    instance_name = models.CharField(max_length=63, blank=True)
    spec_code = models.CharField(max_length=60, blank=True)
    description = models.CharField(max_length=300)
    seconds = models.BigIntegerField(default=0)
    unit_price_per_hour = models.DecimalField(
        max_digits=18, decimal_places=6, null=True, blank=True, help_text="GPU time"
    )
    storage_bytes = models.BigIntegerField(
        null=True, blank=True, help_text="storage: the size billed (GiB × 2^30)"
    )
    month_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="storage: the seconds of the month it was rated in"
    )
    unit_price_per_gib_month = models.DecimalField(
        max_digits=18, decimal_places=6, null=True, blank=True, help_text="storage"
    )
    amount = models.DecimalField(max_digits=20, decimal_places=6)

    class Meta:
        ordering = ["invoice", "position"]
        constraints = [
            models.UniqueConstraint(fields=["invoice", "position"], name="one_line_per_position")
        ]

    def __str__(self) -> str:
        return f"{self.description}: {self.amount}"

    @property
    def gib(self) -> Decimal | None:
        return None if self.storage_bytes is None else bytes_to_gib(self.storage_bytes)


class UsageCorrection(models.Model):
    """A change to usage of a month whose invoice is already issued (a late failover that
    moves a stop back, a repair from the events): the issued invoice stands. When ``month``
    (the month open when the meter found it) is finalized, the corrections of one issued
    invoice that take money back are a credit note against it (``credit_note``); those that
    add are lines on the invoice of ``month`` naming the invoice they correct.

    Keyed like the piece it corrects, ``(segment, start)``; the meter adds a row only for
    what the rows of that key do not hold yet, so running it again adds nothing."""

    segment = models.ForeignKey(UsageSegment, on_delete=models.CASCADE, related_name="corrections")
    start = models.DateTimeField(help_text="the start of the corrected piece")
    corrects = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="corrected_by")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    instance = models.ForeignKey(Instance, on_delete=models.PROTECT, related_name="+")
    spec = models.ForeignKey(Spec, on_delete=models.PROTECT, related_name="+")
    kind = models.CharField(max_length=8, choices=UsageKind.choices)
    disk_gib = models.PositiveIntegerField(default=0)
    unit_price = models.DecimalField(max_digits=18, decimal_places=6)
    month = models.DateField(help_text="first day of the UTC month it is billed in")
    seconds = models.BigIntegerField(help_text="seconds added (negative: taken back)")
    amount_micros = models.BigIntegerField(help_text="the amount in millionths")
    credit_note = models.ForeignKey(
        Invoice,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="credited_corrections",
        help_text="the credit note that took it back, once issued",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["segment", "start", "pk"]
        indexes = [models.Index(fields=["month", "tenant"], name="correction_month_tenant")]

    def __str__(self) -> str:
        return f"correction of {self.corrects_id} in {self.month:%Y-%m}: {self.amount_micros}"


class CreditGrant(models.Model):
    """Credit given to a tenant. Finalization uses it (never more than an invoice's
    subtotal); what is left carries over to the next invoice."""

    class Kind(models.TextChoices):
        PREPAID = "prepaid", "Prepaid"
        PROMOTIONAL = "promotional", "Promotional"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="credit_grants")
    kind = models.CharField(max_length=12, choices=Kind.choices, default=Kind.PREPAID)
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    remaining = models.DecimalField(max_digits=12, decimal_places=2)
    description = models.CharField(max_length=200, blank=True)
    granted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    granted_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-granted_at", "-pk"]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="credit_amount_positive"),
            models.CheckConstraint(
                condition=Q(remaining__gte=0) & Q(remaining__lte=F("amount")),
                name="credit_remaining_in_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} credit {self.amount} for {self.tenant_id}"


class CreditApplication(models.Model):
    """How much of a grant an invoice used."""

    grant = models.ForeignKey(CreditGrant, on_delete=models.PROTECT, related_name="applications")
    invoice = models.ForeignKey(
        Invoice, on_delete=models.PROTECT, related_name="credit_applications"
    )
    amount = models.DecimalField(max_digits=12, decimal_places=2)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["grant", "invoice"], name="one_application_per_grant")
        ]

    def __str__(self) -> str:
        return f"{self.amount} of grant {self.grant_id} on invoice {self.invoice_id}"


class BudgetAlert(models.Model):
    """A threshold of a budget crossed in a month. Unique per tenant, month, threshold and
    budget, so an alert fires at most once for the budget in force: a budget raised from 10 to
    100 alerts again at 50, 80 and 100 % of 100. ``emailed_at`` is set once its email went
    out."""

    THRESHOLDS = (50, 80, 100)

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="budget_alerts")
    month = models.DateField()
    threshold = models.PositiveSmallIntegerField()
    spent = models.DecimalField(max_digits=14, decimal_places=6)
    budget = models.DecimalField(max_digits=12, decimal_places=2)
    created_at = models.DateTimeField(default=timezone.now)
    emailed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-month", "-threshold"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "month", "threshold", "budget"],
                name="one_alert_per_threshold_of_budget",
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.month:%Y-%m} {self.threshold}% of {self.budget}"


class BudgetNoticeDismissal(models.Model):
    """A member hid the budget banner at one level: this month, this threshold, this budget.
    A higher level, another budget or a new month shows it again."""

    membership = models.ForeignKey(Membership, on_delete=models.CASCADE, related_name="+")
    month = models.DateField()
    threshold = models.PositiveSmallIntegerField()
    budget = models.DecimalField(max_digits=12, decimal_places=2)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["membership", "month", "threshold", "budget"],
                name="one_dismissal_per_level",
            )
        ]

    def __str__(self) -> str:
        return f"{self.membership_id} {self.month:%Y-%m} {self.threshold}% of {self.budget}"


class MeterCursor(models.Model):
    """How far the meter has looked: the newest instance event seen by its last repair, and
    the newest price point (``SpecPrice``) whose segments it marked for rating again. One
    row. Events and points after them are checked on the next run however long the meter was
    away (the recent-transition window alone would miss a signal lost while the meter was
    down for longer than the window)."""

    event_id = models.BigIntegerField(default=0)
    price_id = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"events up to {self.event_id}, prices up to {self.price_id}"
