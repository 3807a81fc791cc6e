"""Tenants' volumes: disks of their own, which live on one host from their first attach (or
from the instance whose disk they were) until deleted, whatever their instances do."""

import re
from decimal import ROUND_HALF_UP, Decimal

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from accounts.models import Tenant
from console.catalog.models import Region
from console.fleet.models import Host
from console.instances.models import Instance, new_disk_name

NAME_PATTERN = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


class Volume(models.Model):
    class State(models.TextChoices):
        AVAILABLE = "available", "Available"  # attached to no instance
        ATTACHED = "attached", "Attached"
        DELETED = "deleted", "Deleted"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="volumes")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    name = models.CharField(max_length=63)
    size_gib = models.PositiveIntegerField()
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="volumes")
    state = models.CharField(max_length=12, choices=State.choices, default=State.AVAILABLE)
    # Where it lives: set by the first placement of an instance it is attached to (or, for a
    # kept instance disk, the host that held it); its disk is `disk_name` there.
    host = models.ForeignKey(
        Host, on_delete=models.SET_NULL, null=True, blank=True, related_name="volumes"
    )
    disk_name = models.CharField(max_length=64, unique=True, default=new_disk_name, editable=False)
    # The instance it is attached to, and where that instance's container sees it.
    instance = models.ForeignKey(
        Instance, on_delete=models.SET_NULL, null=True, blank=True, related_name="volumes"
    )
    mount_path = models.CharField(max_length=200, blank=True)
    # The terminated instance whose own disk it was (terminate kept it).
    kept_from = models.OneToOneField(
        Instance, on_delete=models.SET_NULL, null=True, blank=True, related_name="kept_disk"
    )
    # The region's price when it was created: what it is billed at until deleted.
    price_per_gib_month = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal(0))
    created_at = models.DateTimeField(default=timezone.now)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "name"],
                condition=Q(deleted_at__isnull=True),
                name="one_live_volume_per_name",
            )
        ]
        indexes = [models.Index(fields=["tenant", "deleted_at"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.size_gib} GiB, {self.state})"

    @property
    def price_per_month(self) -> Decimal:
        """What it costs a month: its size at its price per GiB-month, to the cent."""
        return (self.price_per_gib_month * self.size_gib).quantize(
            Decimal("0.01"), rounding=ROUND_HALF_UP
        )

    @property
    def owner(self) -> str:
        """Whose disk it is on its host's agent (the disk's record names it)."""
        return f"volume-{self.pk}"
