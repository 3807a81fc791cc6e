"""The operator's hardware: hosts running the agent, their GPUs, and join tokens."""

import base64
import hashlib

from cryptography.fernet import Fernet, MultiFernet
from django.conf import settings
from django.db import models
from django.utils import timezone

from console.catalog.models import MIG_SLICES, GpuModel, Mode, Region
from console.fleet import ssh_authority


def hash_secret(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def _fernet() -> MultiFernet:
    """Keys derived from SECRET_KEY (then SECRET_KEY_FALLBACKS, so a rotated key still opens
    what the old one sealed)."""
    keys = [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]
    return MultiFernet(
        [
            Fernet(base64.urlsafe_b64encode(hashlib.sha256(f"host-secret:{key}".encode()).digest()))
            for key in keys
        ]
    )


def seal_secret(raw: str) -> str:
    return _fernet().encrypt(raw.encode()).decode()


def open_secret(sealed: str) -> str:
    return _fernet().decrypt(sealed.encode()).decode()


class Host(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        CORDONED = "cordoned", "Cordoned"
        DRAINING = "draining", "Draining"
        MAINTENANCE = "maintenance", "Maintenance"
        UNREACHABLE = "unreachable", "Unreachable"
        RETIRED = "retired", "Retired"

    SCHEDULABLE = (Status.ACTIVE,)
    # What an operator may choose. `unreachable` is the watchdog's, never an operator's.
    OPERATOR_STATUSES = (
        Status.ACTIVE,
        Status.CORDONED,
        Status.DRAINING,
        Status.MAINTENANCE,
        Status.RETIRED,
    )
    # What an operator confirms on a page of its own, with a note that the tenants of the
    # host's instances see on their pages.
    ANNOUNCED = (Status.DRAINING, Status.MAINTENANCE)
    # Legal operator transitions of admin_status. Retired is final: a retired machine joins
    # again as a new host, with a new join token.
    TRANSITIONS = {
        Status.ACTIVE: {Status.CORDONED, Status.DRAINING, Status.MAINTENANCE, Status.RETIRED},
        Status.CORDONED: {Status.ACTIVE, Status.DRAINING, Status.MAINTENANCE, Status.RETIRED},
        Status.DRAINING: {Status.ACTIVE, Status.CORDONED, Status.MAINTENANCE, Status.RETIRED},
        Status.MAINTENANCE: {Status.ACTIVE, Status.CORDONED, Status.DRAINING, Status.RETIRED},
        Status.RETIRED: set(),
    }

    name = models.CharField(max_length=100, unique=True)
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="hosts")
    address = models.URLField(help_text="Base URL of the host agent's API")
    # The secret shared with the agent (it signs the agent's calls and ours to it), encrypted
    # with a key derived from SECRET_KEY: the database alone does not give it away.
    sealed_secret = models.TextField(editable=False)
    # sha256 of the secret: how an agent's bearer secret finds its host (then compared in
    # constant time with `secret`).
    secret_hash = models.CharField(max_length=64, db_index=True, blank=True, editable=False)
    # The secret before the last rotation, valid until `previous_secret_until` for the calls
    # in flight (a revoke leaves none), and a new one handed to the agent whose push did not
    # answer: the console takes it as the current one once the agent uses it
    # (console/fleet/identity.py).
    previous_sealed_secret = models.TextField(blank=True, editable=False)
    previous_secret_hash = models.CharField(
        max_length=64, db_index=True, blank=True, editable=False
    )
    previous_secret_until = models.DateTimeField(null=True, blank=True, editable=False)
    pending_sealed_secret = models.TextField(blank=True, editable=False)
    pending_secret_hash = models.CharField(max_length=64, db_index=True, blank=True, editable=False)
    secret_rotated_at = models.DateTimeField(default=timezone.now, editable=False)
    # An address the agent reported that is not `address` (which only the operator or a new
    # join changes): kept so that it is a host event once, not at every heartbeat.
    reported_address = models.CharField(max_length=200, blank=True, editable=False)
    # The subnets of the agent's container networks (its inventory's `container_networks`):
    # no host's address may lie in one (console/fleet/addresses.py).
    container_networks = models.JSONField(default=list, blank=True)
    agent_version = models.CharField(max_length=40, blank=True)
    backend = models.CharField(max_length=16, blank=True)
    runtime = models.CharField(max_length=16, blank=True)
    vcpus = models.PositiveIntegerField(default=0)
    ram_mib = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    # The status an operator chose; `unreachable` overlays it and goes away with heartbeats.
    admin_status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    status_changed_at = models.DateTimeField(default=timezone.now)
    # What the operator told the tenants with the last status (why a drain or maintenance,
    # until when), shown on the pages of the instances on the host.
    operator_note = models.CharField(max_length=500, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    unreachable_since = models.DateTimeField(null=True, blank=True)
    # Since when the agent, still heard, says its container engine does not answer (its
    # heartbeat's `engine`), and the engine's error: the host takes no placement, and its
    # running instances are unreachable from then (console/instances/recovery.py). Null:
    # the engine answers, or the runtime has none.
    engine_down_since = models.DateTimeField(null=True, blank=True)
    engine_detail = models.CharField(max_length=300, blank=True)
    inventory_digest = models.CharField(max_length=64, blank=True)
    # The agent's SSH gateway (its inventory's `ssh`): the port, its host key and that key's
    # fingerprint, which users check on first connect. No port: the gateway is off.
    ssh_port = models.PositiveIntegerField(null=True, blank=True)
    ssh_host_key_fingerprint = models.CharField(max_length=80, blank=True)
    ssh_host_key = models.CharField(max_length=200, blank=True)
    # Until when the gateway presents a host certificate of the console's SSH CA
    # (console/fleet/ssh_authority.py); null: it presents none of this CA.
    ssh_certificate_expires_at = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(default=timezone.now)
    # The agent's image settings as it applies them ({"pre_pull": [...], "mirror": ...}; empty:
    # its runtime holds no images) and each pre-pull's state, from its inventory
    # (console/fleet/images.py).
    image_settings = models.JSONField(default=dict, blank=True)
    pre_pulls = models.JSONField(default=list, blank=True)
    # The registries its agent checks and whether it reaches each ([{"registry", "reachable",
    # "error", "checked_at"}], agent/registry_probe.py): what image availability reads.
    registry_checks = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["name"]
        indexes = [models.Index(fields=["status"])]

    def __str__(self) -> str:
        return self.name

    @property
    def schedulable(self) -> bool:
        return self.status in self.SCHEDULABLE and self.engine_down_since is None

    @property
    def gateway_uncertified(self) -> bool:
        """Its SSH gateway is on but lacks a valid certificate of the console's CA: users
        cannot reach its instances through the SSH front (ssh_authority.uncertified)."""
        return ssh_authority.uncertified(self)

    @property
    def secret(self) -> str:
        return open_secret(self.sealed_secret)

    def set_secret(self, raw: str) -> None:
        self.sealed_secret = seal_secret(raw)
        self.secret_hash = hash_secret(raw)
        self.secret_rotated_at = timezone.now()

    def can_become(self, status: str) -> bool:
        return status in self.TRANSITIONS.get(self.admin_status, set())


class Gpu(models.Model):
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=80, unique=True)
    model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="gpus")
    name = models.CharField(max_length=80, help_text="as the driver names it")
    pci_bus_id = models.CharField(max_length=32, blank=True)
    memory_mib = models.PositiveIntegerField()
    mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.WHOLE)
    mig_enabled = models.BooleanField(default=False)
    mig_devices = models.JSONField(default=list, blank=True, help_text="as the agent reports them")
    driver_version = models.CharField(max_length=32, blank=True)
    cuda_version = models.CharField(max_length=16, blank=True)
    healthy = models.BooleanField(default=True)
    health_reason = models.CharField(max_length=200, blank=True)
    health_changed_at = models.DateTimeField(null=True, blank=True)
    mode_changing_to = models.CharField(
        max_length=8,
        choices=Mode.choices,
        blank=True,
        help_text="while its agent repartitions it: placement takes nothing on it",
    )

    MISSING = "missing from inventory"

    class Meta:
        ordering = ["host", "index"]
        constraints = [models.UniqueConstraint(fields=["host", "index"], name="gpu_index_per_host")]

    def __str__(self) -> str:
        return f"{self.host.name}/gpu{self.index}"

    @property
    def usage_label(self) -> str:
        """Slices in use, for operators. Needs the annotations of `with_usage()`."""
        if self.mode == Mode.WHOLE:
            return "in use" if self.claim_count else "free"
        if self.mode == Mode.MIG:
            return f"{self.slot_count}/{MIG_SLICES} slices"
        return f"{self.milli_used or 0}/1000 milli"

    @classmethod
    def with_usage(cls) -> models.QuerySet:
        return cls.objects.select_related("model").annotate(
            claim_count=models.Count("claims"),
            slot_count=models.Count("claims__slot"),
            milli_used=models.Sum("claims__milli"),
        )


class HostEvent(models.Model):
    """One change of a host's status: who (an operator, or `system`), when, why."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    actor_label = models.CharField(max_length=80, help_text="a username or 'system'")
    from_status = models.CharField(max_length=16, choices=Host.Status.choices, blank=True)
    to_status = models.CharField(max_length=16, choices=Host.Status.choices)
    message = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-at", "-pk"]

    def __str__(self) -> str:
        return f"{self.host_id}: {self.from_status or '∅'} → {self.to_status}"


class JoinToken(models.Model):
    """A one-time secret an operator hands to a new host so that its agent can register."""

    PREFIX = "gpj"

    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="join_tokens")
    note = models.CharField(max_length=120, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    host = models.OneToOneField(
        Host, on_delete=models.SET_NULL, null=True, blank=True, related_name="join_token"
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"join token {self.prefix}…"

    @staticmethod
    def hash(raw: str) -> str:
        return hash_secret(raw)

    @property
    def state(self) -> str:
        if self.used_at is not None:
            return "used"
        if self.expires_at <= timezone.now():
            return "expired"
        return "unused"


class HostImage(models.Model):
    """An image a host holds, by one of its references (normalized as the agents do,
    console/fleet/images.py): what placement prefers a host for."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="images")
    reference = models.CharField(max_length=255)
    image_id = models.CharField(max_length=80)
    size_bytes = models.BigIntegerField(default=0)
    layers = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["host", "reference"]
        constraints = [
            models.UniqueConstraint(fields=["host", "reference"], name="host_image_reference")
        ]
        indexes = [models.Index(fields=["reference"])]

    def __str__(self) -> str:
        return f"{self.host_id}: {self.reference}"
