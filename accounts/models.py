import hashlib
from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from accounts.roles import Role, at_least


class Tenant(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        SUSPENDED = "suspended", "Suspended"

    name = models.CharField(max_length=120)
    slug = models.SlugField(max_length=50, unique=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    created_at = models.DateTimeField(default=timezone.now)
    suspended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_active(self) -> bool:
        return self.status == self.Status.ACTIVE


class Quota(models.Model):
    class BudgetAction(models.TextChoices):
        ALERT = "alert", "Alert only"
        STOP = "stop", "Refuse launches and stop running instances"

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="quota")
    gpu_quota = models.DecimalField(
        "GPU quota (GPU-equivalents)",
        max_digits=8,
        decimal_places=3,
        default=Decimal("1"),
        validators=[MinValueValidator(Decimal("0"))],
    )
    max_instances = models.PositiveIntegerField(default=4)
    storage_quota_gib = models.PositiveIntegerField(
        "storage quota (GiB)",
        default=500,
        help_text="the most GiB of volumes the tenant may hold at once",
    )
    monthly_budget = models.DecimalField(
        max_digits=12,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0"))],
        help_text="Leave empty for no budget.",
    )
    budget_action = models.CharField(
        max_length=8, choices=BudgetAction.choices, default=BudgetAction.ALERT
    )

    def __str__(self) -> str:
        return f"Quota of {self.tenant}"


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["tenant__name", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="one_membership_per_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"

    def can(self, needed: str) -> bool:
        return at_least(self.role, needed)


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiToken(models.Model):
    """A bearer token acting as its user inside one tenant. Only a hash is stored. A
    read-only token acts with the viewer role whatever its user's role (a viewer's tokens
    are always read-only). A scoped token may do only what its scopes name, and one with an
    instance prefix sees only the instances whose name starts with it (accounts.scopes)."""

    PREFIX = "gpc"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=80)
    prefix = models.CharField(max_length=12, unique=True)
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    read_only = models.BooleanField(
        default=False, help_text="Reads only: acts with the viewer role, every write is a 403."
    )
    scopes = models.JSONField(
        null=True,
        blank=True,
        default=None,
        help_text="The scopes it holds (accounts.scopes); empty: whatever its user's role allows.",
    )
    instance_prefix = models.CharField(
        max_length=40,
        blank=True,
        default="",
        help_text="Sees and acts on only the instances whose name starts with this.",
    )
    issued_by = models.ForeignKey(
        "self",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="The token that created it through the API (it never exceeds that one).",
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_scoped(self) -> bool:
        return self.scopes is not None

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    def is_expired(self, now=None) -> bool:
        return self.expires_at is not None and self.expires_at <= (now or timezone.now())

    @property
    def state(self) -> str:
        if self.is_revoked:
            return "revoked"
        if self.is_expired():
            return "expired"
        return "active"


class Invitation(models.Model):
    """An invitation to join a tenant, sent to an email address. Only a hash of the link's
    token is stored; whoever accepts must hold an account with that address."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="accepted_invitations",
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.email} to {self.tenant} ({self.role})"

    def is_expired(self, now=None) -> bool:
        return self.expires_at <= (now or timezone.now())

    @property
    def state(self) -> str:
        if self.accepted_at is not None:
            return "accepted"
        if self.revoked_at is not None:
            return "revoked"
        if self.is_expired():
            return "expired"
        return "pending"


class SshKey(models.Model):
    """A public SSH key of one member in one tenant (accounts.ssh_keys parses and adds them).
    Instances grant some of their tenant's keys; a viewer's keys open nothing."""

    membership = models.ForeignKey(Membership, on_delete=models.CASCADE, related_name="ssh_keys")
    name = models.CharField(max_length=64)
    public_key = models.TextField(help_text="one line: the algorithm, the key and a comment")
    fingerprint = models.CharField(max_length=80, help_text="SHA256:… as ssh-keygen -l shows it")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["membership", "name"], name="ssh_key_name_per_member")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint})"

    @property
    def algorithm(self) -> str:
        return self.public_key.split(" ", 1)[0]
