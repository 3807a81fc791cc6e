"""Idle policies at three levels, the stricter winning (console.idle.rules): the operator's for
a tenant (set in the Django admin; the tenant cannot weaken it), the tenant's default (its
admins), and an instance's own. And per instance, where the watch stands in its current run."""

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from accounts.models import Tenant
from console.instances.models import Instance

MIN_MINUTES = Decimal("0.05")  # 3 seconds: short enough for a demo, the tests use it
WEEK_MINUTES = Decimal(7 * 24 * 60)


class Action(models.TextChoices):
    """What happens to an instance found idle (or past its maximum runtime), mildest first.
    Shelve stops it, then puts its disk in a snapshot and off its host (console.snapshots)."""

    NOTIFY = "notify", "Notify only"
    STOP = "stop", "Stop"
    SHELVE = "shelve", "Stop, then shelve"
    TERMINATE = "terminate", "Terminate"


def _minutes(**options) -> models.DecimalField:
    return models.DecimalField(
        max_digits=8,
        decimal_places=2,
        validators=[MinValueValidator(MIN_MINUTES), MaxValueValidator(WEEK_MINUTES)],
        **options,
    )


class Policy(models.Model):
    """One level's policy. Each field's "stricter" is defined in console.idle.rules."""

    window_minutes = _minutes(
        null=True,
        blank=True,
        help_text="idle minutes before the warning; empty: no idle rule",
    )
    threshold_percent = models.PositiveSmallIntegerField(
        default=5,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="GPU utilisation of its slice below this counts as idle",
    )
    count_gpu = models.BooleanField(default=True, help_text="GPU utilisation keeps it busy")
    count_ssh = models.BooleanField(default=True, help_text="an open SSH session keeps it busy")
    count_terminal = models.BooleanField(
        default=True, help_text="an open browser terminal keeps it busy"
    )
    count_ports = models.BooleanField(
        default=True, help_text="requests to its web ports keep it busy"
    )
    action = models.CharField(max_length=12, choices=Action.choices, default=Action.STOP)
    warning_minutes = models.DecimalField(
        max_digits=8,
        decimal_places=2,
        default=Decimal(10),
        validators=[MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(24 * 60))],
        help_text="how long before acting the warning goes out",
    )
    allow_keep_running = models.BooleanField(
        default=True, help_text="the tenant may keep it running once per run, after a warning"
    )
    max_runtime_minutes = _minutes(
        null=True, blank=True, help_text="the longest one run may last; empty: no limit"
    )
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True


class OperatorPolicy(Policy):
    """The operator's policy for one tenant: tenants see it in force and cannot weaken it."""

    tenant = models.OneToOneField(
        Tenant, on_delete=models.CASCADE, related_name="operator_idle_policy"
    )
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        verbose_name = "operator idle policy"
        verbose_name_plural = "operator idle policies"

    def __str__(self) -> str:
        return f"operator's idle policy for {self.tenant}"


class TenantPolicy(Policy):
    """A tenant's default for its instances (its admins set it)."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="idle_policy")

    class Meta:
        verbose_name = "tenant idle policy"
        verbose_name_plural = "tenant idle policies"

    def __str__(self) -> str:
        return f"{self.tenant}'s idle policy"


class InstancePolicy(Policy):
    """An instance's own policy (set at launch or on its page)."""

    instance = models.OneToOneField(Instance, on_delete=models.CASCADE, related_name="idle_policy")

    class Meta:
        verbose_name = "instance idle policy"
        verbose_name_plural = "instance idle policies"

    def __str__(self) -> str:
        return f"{self.instance}'s idle policy"


class Watch(models.Model):
    """Where the idle watch stands in an instance's current run (`allocation_id`): the warning
    it sent (what for, when, and when it acts), what it did, and whether the tenant kept it
    running. A new run starts from a clean watch."""

    class Kind(models.TextChoices):
        IDLE = "idle", "Idle"
        MAX_RUNTIME = "max_runtime", "Maximum runtime"

    instance = models.OneToOneField(Instance, on_delete=models.CASCADE, related_name="idle_watch")
    allocation_id = models.CharField(max_length=64, blank=True)
    kind = models.CharField(max_length=12, choices=Kind.choices, blank=True)
    warned_at = models.DateTimeField(null=True, blank=True)
    acts_at = models.DateTimeField(null=True, blank=True)
    acted_at = models.DateTimeField(null=True, blank=True)
    kept_at = models.DateTimeField(null=True, blank=True)
    kept_kind = models.CharField(max_length=12, choices=Kind.choices, blank=True)
    # The action was shelve: once stopped, the instance is shelved (console.snapshots).
    shelve_on_stop = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"idle watch of instance {self.instance_id}"
