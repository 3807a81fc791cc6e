"""Snapshots of volumes in the operator's snapshot store (a restic repository per tenant),
their restores, their schedules, and shelved instances (whose volumes live only as snapshots
while they are shelved)."""

import uuid
from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from accounts.models import Tenant
from console.catalog.models import Region
from console.fleet.models import Host
from console.instances.models import Instance
from console.volumes.models import Volume


class Progress(models.Model):
    """A job on a host agent, polled for its bytes done of total and its ETA."""

    class State(models.TextChoices):
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    state = models.CharField(max_length=12, choices=State.choices, default=State.RUNNING)
    bytes_done = models.BigIntegerField(default=0)
    bytes_total = models.BigIntegerField(default=0)
    eta_seconds = models.FloatField(null=True, blank=True)
    error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    @property
    def percent(self) -> int:
        if self.state == self.State.DONE:
            return 100
        return int(100 * self.bytes_done / self.bytes_total) if self.bytes_total else 0


class TenantStore(models.Model):
    """A tenant's own repository in the snapshot store, named by `key` (its path under
    SNAPSHOT_REPOSITORY, and the context its password is derived with: console/snapshots/
    store.py). The key never changes and is never given to another tenant: the row outlives
    nothing it names (its tenant cannot be deleted while it exists)."""

    tenant = models.OneToOneField(Tenant, on_delete=models.PROTECT, related_name="snapshot_store")
    key = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"the snapshot store of {self.tenant}"


class Shelf(models.Model):
    """A shelved instance: its volumes were snapshotted and removed from their host; it holds
    no slice and costs only its snapshots' storage. Starting it restores them on whichever
    host it is placed on (provisioning waits for that), then the shelf goes."""

    class State(models.TextChoices):
        SHELVING = "shelving", "Shelving"  # its snapshots are being taken
        SHELVED = "shelved", "Shelved"
        UNSHELVING = "unshelving", "Unshelving"  # its volumes are being restored

    instance = models.OneToOneField(Instance, on_delete=models.CASCADE, related_name="shelf")
    state = models.CharField(max_length=12, choices=State.choices, default=State.SHELVING)
    host = models.ForeignKey(
        Host, on_delete=models.SET_NULL, null=True, blank=True, related_name="+",
        help_text="where its disk was, or is being restored to",
    )  # fmt: skip
    created_at = models.DateTimeField(default=timezone.now)
    shelved_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.instance.name}: {self.state}"


class Schedule(models.Model):
    """Snapshots of an instance's disk, or of a volume, every `every_hours`, the newest `keep`
    of them kept."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="snapshot_schedules")
    instance = models.OneToOneField(
        Instance, on_delete=models.CASCADE, null=True, blank=True, related_name="snapshot_schedule"
    )
    volume = models.OneToOneField(
        Volume, on_delete=models.CASCADE, null=True, blank=True, related_name="snapshot_schedule"
    )
    every_hours = models.PositiveSmallIntegerField()
    keep = models.PositiveSmallIntegerField()
    last_run_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(instance__isnull=False) ^ Q(volume__isnull=False),
                name="schedule_of_an_instance_or_a_volume",
            )
        ]

    def __str__(self) -> str:
        return f"{self.source_name}: every {self.every_hours} h, keep {self.keep}"

    @property
    def source_name(self) -> str:
        return self.instance.name if self.instance_id else f"volume {self.volume.name}"

    def due(self, now) -> bool:
        return self.last_run_at is None or (now - self.last_run_at).total_seconds() >= (
            self.every_hours * 3600
        )


class StoreMeasurement(models.Model):
    """What a tenant's repository held at `measured_at` (a whole second), measured by restic
    after a backup, a forget or a prune there: the tenant is billed for `bytes` from then until
    the next measurement (billing/storage.py), at the price per GiB-month of the region of the
    snapshot whose job measured it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="store_measurements")
    measured_at = models.DateTimeField()
    bytes = models.BigIntegerField()
    price_per_gib_month = models.DecimalField(max_digits=12, decimal_places=6)

    class Meta:
        ordering = ["tenant", "measured_at", "pk"]
        indexes = [models.Index(fields=["tenant", "measured_at"])]

    def __str__(self) -> str:
        return f"the snapshot store of {self.tenant}: {self.bytes} bytes at {self.measured_at}"


class Snapshot(Progress):
    """A snapshot of an instance's disk or of a volume, taken on its host into its tenant's
    repository (or, taken before the store was split per tenant, the shared one). One in its
    tenant's repository is billed as part of that repository (StoreMeasurement), and knows
    its share of it as last measured: `bytes_unique` (what deleting it frees), `bytes_shared`
    (what other snapshots hold too). One in the shared repository is billed for
    `bytes_stored` (the new data it added there) from `finished_at` until `deleted_at`."""

    class Kind(models.TextChoices):
        ON_DEMAND = "on_demand", "On demand"
        SCHEDULED = "scheduled", "Scheduled"
        SHELVE = "shelve", "Shelve"

    class Store(models.TextChoices):
        TENANT = "tenant", "Its tenant's repository"
        LEGACY = "legacy", "The shared repository (taken before the split)"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="snapshots")
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="snapshots")
    instance = models.ForeignKey(
        Instance, on_delete=models.SET_NULL, null=True, blank=True, related_name="snapshots"
    )
    volume = models.ForeignKey(
        Volume, on_delete=models.SET_NULL, null=True, blank=True, related_name="snapshots"
    )
    source_name = models.CharField(max_length=100, help_text="what it is a snapshot of")
    disk_name = models.CharField(max_length=128, help_text="the disk's name on its host")
    size_gib = models.PositiveIntegerField(help_text="the disk's size: a restore's at least")
    host = models.ForeignKey(Host, on_delete=models.SET_NULL, null=True, related_name="+")
    kind = models.CharField(max_length=12, choices=Kind.choices, default=Kind.ON_DEMAND)
    shelf = models.ForeignKey(
        Shelf, on_delete=models.SET_NULL, null=True, blank=True, related_name="snapshots"
    )
    store = models.CharField(
        max_length=8, choices=Store.choices, default=Store.TENANT,
        help_text="the repository that holds it: its restores and forget go there",
    )  # fmt: skip
    restic_id = models.CharField(max_length=64, blank=True)
    bytes_stored = models.BigIntegerField(default=0)
    bytes_unique = models.BigIntegerField(null=True, blank=True)
    bytes_shared = models.BigIntegerField(null=True, blank=True)
    # The region's price when it was taken: what its stored data is billed at until deleted.
    price_per_gib_month = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal(0))
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    deleted_at = models.DateTimeField(null=True, blank=True)
    forgotten = models.BooleanField(default=False, help_text="gone from the repository too")

    class Meta:
        ordering = ["-created_at", "-pk"]
        indexes = [models.Index(fields=["tenant", "deleted_at"])]

    def __str__(self) -> str:
        return f"snapshot {self.pk} of {self.source_name} ({self.state})"

    @property
    def job_id(self) -> str:
        return f"snapshot-{self.pk}"


class Restore(Progress):
    """A snapshot restored into a disk on a host: an instance's own disk again when it is
    unshelved, or a new volume's."""

    snapshot = models.ForeignKey(Snapshot, on_delete=models.PROTECT, related_name="restores")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    instance = models.ForeignKey(
        Instance, on_delete=models.CASCADE, null=True, blank=True, related_name="restores"
    )
    volume = models.ForeignKey(
        Volume, on_delete=models.CASCADE, null=True, blank=True, related_name="restores",
        help_text="the new volume it fills",
    )  # fmt: skip
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="+")
    disk_name = models.CharField(max_length=128)
    shelf = models.ForeignKey(
        Shelf, on_delete=models.SET_NULL, null=True, blank=True, related_name="restores"
    )

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.CheckConstraint(
                condition=Q(instance__isnull=False) ^ Q(volume__isnull=False),
                name="restore_into_an_instance_or_a_volume",
            )
        ]

    def __str__(self) -> str:
        return f"restore {self.pk} of snapshot {self.snapshot_id} on {self.host}"

    @property
    def job_id(self) -> str:
        return f"restore-{self.pk}"
