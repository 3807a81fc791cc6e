"""What tenants can rent: regions, GPU models and their MIG profiles, specs, images."""

import re
from datetime import UTC, datetime
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models, transaction
from django.utils import timezone

from console.scheduler.model import MIG_SLICES


class Mode(models.TextChoices):
    WHOLE = "whole", "Whole GPUs"
    MIG = "mig", "MIG slice"
    SHARED = "shared", "Shared fraction"


def gpu_equivalents(mode: str, gpu_count: int, mig_size: int | None, milli: int | None) -> Decimal:
    """How much GPU quota one instance of a spec uses (a quarter GPU is 0.25), from its mode
    and the figure that mode reads: whole GPUs, its MIG profile's slices, or thousandths."""
    if mode == Mode.WHOLE:
        return Decimal(gpu_count)
    if mode == Mode.MIG:
        return Decimal(mig_size) / MIG_SLICES
    return Decimal(milli) / 1000


def price_in_force(points: list[tuple[datetime, Decimal]], at: datetime | None = None) -> Decimal:
    """Of a spec's price points (effective from, price per hour), oldest first, the price in
    force at ``at`` (now): the latest point not after it. The first point also covers any
    time before it (the spec's price since it exists)."""
    at = at or timezone.now()
    in_force = [price for effective_from, price in points if effective_from <= at]
    return in_force[-1] if in_force else points[0][1]


REGISTRY_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}(:[0-9]{1,5})?")


class Region(models.Model):
    code = models.SlugField(max_length=40, unique=True)
    name = models.CharField(max_length=80)
    # What storage costs there: volumes per GiB-month of their size, from creation to
    # deletion; snapshots per GiB-month of the data they store.
    volume_price_per_gib_month = models.DecimalField(
        max_digits=12, decimal_places=6, default=Decimal("0.100000")
    )
    snapshot_price_per_gib_month = models.DecimalField(
        max_digits=12, decimal_places=6, default=Decimal("0.050000")
    )
    # A registry mirror (a pull-through cache) the region's agents pull images through first,
    # falling back to each image's own registry when it fails.
    registry_mirror = models.CharField(
        max_length=255,
        blank=True,
        validators=[
            RegexValidator(
                r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}(:[0-9]{1,5})?\Z",
                "A registry's host[:port], e.g. mirror.internal:5000 (no scheme, no path).",
            )
        ],
        help_text="host[:port] of a registry mirror its hosts pull through first, e.g. "
        "127.0.0.1:5001; empty: each image's own registry",
    )
    # The images tenants may name themselves (console/catalog/registries.py): whether they
    # may at all, and from which registries (the mirror is always allowed).
    tenant_images = models.BooleanField(
        default=True,
        help_text="tenants may launch image references of their own, not only the catalog's",
    )
    allowed_registries = models.JSONField(
        default=list,
        blank=True,
        help_text='registries (host[:port]) tenants may pull from, e.g. ["ghcr.io", '
        '"quay.io"]; empty: any registry. The registry mirror is always allowed.',
    )

    class Meta:
        ordering = ["code"]

    def __str__(self) -> str:
        return self.name

    def clean(self):
        hosts = self.allowed_registries
        if not isinstance(hosts, list) or not all(
            isinstance(host, str) and REGISTRY_HOST.fullmatch(host) for host in hosts
        ):
            raise ValidationError(
                {"allowed_registries": 'A list of registries\' host[:port], e.g. ["ghcr.io"].'}
            )


class GpuModel(models.Model):
    code = models.SlugField(max_length=40, unique=True, help_text="e.g. a100-80gb")
    name = models.CharField(max_length=80, help_text="e.g. NVIDIA A100 80GB")
    memory_mib = models.PositiveIntegerField()
    mig_capable = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class MigProfile(models.Model):
    """A MIG instance profile and where it may start among the GPU's 8 memory slices."""

    gpu_model = models.ForeignKey(GpuModel, on_delete=models.CASCADE, related_name="mig_profiles")
    name = models.CharField(max_length=20, help_text="e.g. 1g.10gb")
    compute_slices = models.PositiveSmallIntegerField()
    size = models.PositiveSmallIntegerField(help_text="memory slices taken (1, 2, 4 or 8)")
    starts = models.JSONField(help_text="allowed start slices, e.g. [0, 2, 4, 6]")
    memory_mib = models.PositiveIntegerField()

    class Meta:
        ordering = ["gpu_model", "size", "compute_slices"]
        constraints = [
            models.UniqueConstraint(fields=["gpu_model", "name"], name="unique_mig_profile")
        ]

    def __str__(self) -> str:
        return f"{self.gpu_model.code} {self.name}"

    def clean(self):
        if self.size not in (1, 2, 4, 8):
            raise ValidationError({"size": "A MIG profile takes 1, 2, 4 or 8 memory slices."})
        starts = self.starts if isinstance(self.starts, list) else None
        if not starts or any(
            not isinstance(s, int) or s < 0 or s + self.size > MIG_SLICES for s in starts
        ):
            raise ValidationError(
                {"starts": f"Starts must be slice numbers that fit in {MIG_SLICES} slices."}
            )


class Spec(models.Model):
    """A flavor: what a tenant picks and pays for."""

    code = models.CharField(
        max_length=60,
        unique=True,
        validators=[
            RegexValidator(
                r"^[a-z0-9][a-z0-9._-]*\Z",
                "Lower-case letters, digits, dots, dashes and underscores only.",
            )
        ],
    )
    name = models.CharField(max_length=120)
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="specs")
    mode = models.CharField(max_length=8, choices=Mode.choices)
    gpu_count = models.PositiveSmallIntegerField(default=1)
    mig_profile = models.ForeignKey(
        MigProfile, on_delete=models.PROTECT, null=True, blank=True, related_name="specs"
    )
    milli = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="shared mode: thousandths of a GPU (250 = 1/4)"
    )
    gpu_memory_mib = models.PositiveIntegerField()
    vcpus = models.PositiveSmallIntegerField()
    ram_mib = models.PositiveIntegerField()
    disk_gib = models.PositiveIntegerField()
    active = models.BooleanField(default=True, help_text="Retired specs cannot be launched.")

    class Meta:
        ordering = ["gpu_model__name", "mode", "gpu_count", "milli", "code"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs):
        """A new spec is saved with its first price point (``price_per_hour``)."""
        adding = self._state.adding
        if adding and getattr(self, "_first_price", None) is None:
            raise ValidationError({"price_per_hour": "A new spec needs a price per hour."})
        with transaction.atomic():
            super().save(*args, **kwargs)
            if adding:
                SpecPrice.objects.create(spec=self, price_per_hour=self._first_price)

    # The price lives in one place, the spec's price history (``SpecPrice``): billing rates
    # with it, and everything that shows or checks a price reads ``current_price``.

    @property
    def price_per_hour(self) -> Decimal:
        """The price per hour in force now. Given to a new spec (``Spec(price_per_hour=…)``),
        it is the spec's first price point, saved with it."""
        return self.current_price()

    @price_per_hour.setter
    def price_per_hour(self, value: Decimal) -> None:
        if not self._state.adding:
            raise AttributeError("A saved spec's price changes with a new SpecPrice point.")
        self._first_price = Decimal(value)

    def price_points(self) -> list["SpecPrice"]:
        """The price history, oldest first (from ``prefetch_related("prices")`` if done)."""
        return sorted(self.prices.all(), key=lambda point: point.effective_from)

    def current_price(self, at: datetime | None = None) -> Decimal | None:
        """The price per hour in force at ``at`` (now), as ``price_in_force`` reads it."""
        if self._state.adding:
            return getattr(self, "_first_price", None)
        points = self.price_points()
        return price_in_force([(p.effective_from, p.price_per_hour) for p in points], at)

    def next_price_change(self, at: datetime | None = None) -> "SpecPrice | None":
        """The next scheduled price point after ``at`` (now), if any."""
        at = at or timezone.now()
        return next((point for point in self.price_points() if point.effective_from > at), None)

    @property
    def gpu_equivalents(self) -> Decimal:
        """How much GPU quota one instance of this spec uses (a quarter GPU is 0.25)."""
        mig_size = self.mig_profile.size if self.mode == Mode.MIG else None
        return gpu_equivalents(self.mode, self.gpu_count, mig_size, self.milli)

    def clean(self):
        errors = {}
        if self.mode == Mode.WHOLE:
            if self.gpu_count not in (1, 2, 4, 8):
                errors["gpu_count"] = "Whole-GPU specs have 1, 2, 4 or 8 GPUs."
            if self.mig_profile_id or self.milli:
                errors["mode"] = "A whole-GPU spec has no MIG profile and no fraction."
        elif self.mode == Mode.MIG:
            if self.mig_profile_id is None:
                errors["mig_profile"] = "A MIG spec needs a MIG profile."
            elif self.mig_profile.gpu_model_id != self.gpu_model_id:
                errors["mig_profile"] = "The MIG profile belongs to another GPU model."
            if self.gpu_model_id and not self.gpu_model.mig_capable:
                errors["gpu_model"] = "This GPU model does not support MIG."
            if self.gpu_count != 1 or self.milli:
                errors["gpu_count"] = "A MIG spec is one MIG instance on one GPU."
        elif self.mode == Mode.SHARED:
            if not self.milli or not 0 < self.milli < 1000:
                errors["milli"] = "A shared spec takes between 1 and 999 milli-GPU."
            if self.gpu_count != 1 or self.mig_profile_id:
                errors["gpu_count"] = "A shared spec is a fraction of one GPU."
            if self.gpu_model_id and self.gpu_memory_mib > self.gpu_model.memory_mib:
                errors["gpu_memory_mib"] = "The memory cap is larger than the GPU's memory."
        if errors:
            raise ValidationError(errors)


class SpecPrice(models.Model):
    """Price history: the price of a spec from a moment on. Billing rates usage with it."""

    spec = models.ForeignKey(Spec, on_delete=models.CASCADE, related_name="prices")
    effective_from = models.DateTimeField(default=timezone.now)
    price_per_hour = models.DecimalField(
        max_digits=10, decimal_places=4, validators=[MinValueValidator(Decimal("0"))]
    )

    class Meta:
        ordering = ["spec", "effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["spec", "effective_from"], name="one_price_per_moment")
        ]

    def __str__(self) -> str:
        return f"{self.spec.code} {self.price_per_hour}/h from {self.effective_from:%Y-%m-%d %H:%M}"

    def clean(self):
        """A change comes after the spec's first price, which covers all time before it (a
        point before it would re-price everything earlier), and never in a month that is
        closed (what a tenant was billed for it stays what its usage page says)."""
        if self.spec_id is None or self.effective_from is None:
            return
        first = (
            SpecPrice.objects.filter(spec_id=self.spec_id)
            .exclude(pk=self.pk)
            .order_by("effective_from")
            .values_list("effective_from", flat=True)
            .first()
        )
        if first is not None and self.effective_from < first:
            message = f"A price change comes after the first price ({first:%Y-%m-%d %H:%M} UTC)."
            raise ValidationError({"effective_from": message})
        opened = (
            timezone.now().astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        )
        if first is not None and self.effective_from < opened:
            message = (
                f"A price change takes effect in the open month (from {opened:%Y-%m-%d} UTC) or "
                "later: earlier months are invoiced, and a correction there is a credit note."
            )
            raise ValidationError({"effective_from": message})


# The shapes of what a workload is told: environment names as POSIX shells accept them, less
# those the platform sets itself or the GPU stack reads (the NVIDIA driver and container
# toolkit's, CUDA's MPS and device choice, the agent's): a tenant cannot widen its GPUs with them.
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
RESERVED_ENV = re.compile(r"NVIDIA_|CUDA_MPS_|GPUCLOUD_|CUDA_VISIBLE_DEVICES\Z|JUPYTER_TOKEN\Z")
# What a served port may say it is: an app that signs in with the instance's own token.
APPS = ("jupyter",)
PORT_KEYS = {"port", "name", "app"}
MAX_ARGS = 64
MAX_ENV = 64
MAX_VALUE = 4096
# A CUDA version as drivers report theirs (nvidia-smi's "CUDA Version: 12.4"), a patch allowed.
CUDA_VERSION = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}(?:\.[0-9]{1,3})?")


def cuda_tuple(version: str) -> tuple[int, int] | None:
    """(major, minor) of a CUDA version, None when it is empty or not one."""
    if not CUDA_VERSION.fullmatch(version or ""):
        return None
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


# An OCI reference: [registry[:port]/]path[:tag][@digest], lower-case path (no spaces).
REFERENCE = re.compile(
    r"(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[a-z0-9]+:[a-f0-9]{32,})?"
)


def command_errors(command) -> list[str]:
    """What is wrong with a command (a list of 1..64 strings of up to 4096 characters)."""
    if not isinstance(command, list) or not all(isinstance(arg, str) for arg in command):
        return ["Must be a list of strings."]
    if len(command) > MAX_ARGS:
        return [f"At most {MAX_ARGS} arguments."]
    if any(len(arg) > MAX_VALUE for arg in command):
        return [f"Each argument has at most {MAX_VALUE} characters."]
    return []


def env_errors(env) -> list[str]:
    """What is wrong with an environment ({NAME: value}, up to 64 names like PATH_2)."""
    if not isinstance(env, dict):
        return ["Must be an object of names to strings."]
    if len(env) > MAX_ENV:
        return [f"At most {MAX_ENV} variables."]
    errors = []
    for name, value in env.items():
        if not ENV_NAME.fullmatch(name):
            errors.append(f"{name!r} is not a variable name (A-Z, 0-9 and _, not first a digit).")
        elif RESERVED_ENV.match(name):
            errors.append(
                f"{name} is the platform's: names starting with NVIDIA_, CUDA_MPS_ or GPUCLOUD_, "
                "and CUDA_VISIBLE_DEVICES, are set for the instance's GPUs, JUPYTER_TOKEN for "
                "its Jupyter."
            )
        elif not isinstance(value, str):
            errors.append(f"{name}: the value must be a string.")
        elif len(value) > MAX_VALUE:
            errors.append(f"{name}: the value has more than {MAX_VALUE} characters.")
    return errors


def port_errors(ports) -> list[str]:
    """What is wrong with a list of served ports ([{"port": 8888, "name": "Jupyter"}]); an
    entry may say which app signs in with the instance's token ("app": "jupyter")."""
    if not isinstance(ports, list):
        return ['Must be a list like [{"port": 8888, "name": "Jupyter"}].']
    errors, seen = [], set()
    apps = " or ".join(f'"{app}"' for app in APPS)
    for entry in ports:
        if not isinstance(entry, dict) or not {"port", "name"} <= set(entry) <= PORT_KEYS:
            errors.append(
                f'{entry!r}: each entry is {{"port": <number>, "name": <text>}}, and may add '
                f'"app": {apps}.'
            )
            continue
        port, name = entry["port"], entry["name"]
        if "app" in entry and entry["app"] not in APPS:
            errors.append(f"{entry['app']!r}: the app is one of {', '.join(APPS)}.")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            errors.append(f"{port!r}: a port is a number from 1 to 65535.")
        elif port in seen:
            errors.append(f"Port {port} is listed twice.")
        if not isinstance(name, str) or not name.strip() or len(name) > 40:
            errors.append(f"{name!r}: a port's name is 1 to 40 characters.")
        seen.add(port)
    return errors


class RestartPolicy(models.TextChoices):
    """What happens to an instance whose workload ended, or whose host was lost: `never` it
    stays as it ended; `on-failure` it runs again when it failed (a host lost, and for a
    workload exit one that failed); `always` also when its workload exited 0."""

    NEVER = "never", "Never"
    ON_FAILURE = "on-failure", "On failure"
    ALWAYS = "always", "Always"


class Image(models.Model):
    name = models.CharField(max_length=80, unique=True)
    reference = models.CharField(
        max_length=255,
        help_text="OCI reference hosts pull: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
    )
    cuda_version = models.CharField(
        max_length=16,
        blank=True,
        help_text="the CUDA version it was built for, e.g. 12.4: a host runs it when its driver "
        "supports that version or later; empty for an image without CUDA",
    )
    description = models.TextField(blank=True)
    command = models.JSONField(
        default=list,
        blank=True,
        help_text='default command, e.g. ["jupyter", "lab"]; empty: the image\'s own CMD',
    )
    env = models.JSONField(
        default=dict, blank=True, help_text='default environment {"NAME": "value"}'
    )
    ports = models.JSONField(
        default=list,
        blank=True,
        help_text='ports it serves, e.g. [{"port": 8888, "name": "Jupyter", "app": "jupyter"}]; '
        '"app": "jupyter" gives each instance a token in JUPYTER_TOKEN and opens the port '
        "signed in with it",
    )
    restart_policy = models.CharField(
        max_length=12,
        choices=RestartPolicy.choices,
        default=RestartPolicy.ON_FAILURE,
        help_text="the restart policy of its instances unless their launch chooses one",
    )
    active = models.BooleanField(default=True)
    pre_pull = models.BooleanField(
        default=False,
        help_text="hosts pull it ahead of any launch (when they join and when this changes) "
        "and their image clean-up keeps it",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self):
        errors = {}
        if not REFERENCE.fullmatch(self.reference or ""):
            errors["reference"] = "An OCI reference, e.g. docker.io/library/python:3.12-slim."
        if self.cuda_version and not CUDA_VERSION.fullmatch(self.cuda_version):
            errors["cuda_version"] = "A CUDA version like 12.4, or empty for an image without CUDA."
        if self.command and (problems := command_errors(self.command)):
            errors["command"] = problems
        if problems := env_errors(self.env):
            errors["env"] = problems
        if problems := port_errors(self.ports):
            errors["ports"] = problems
        if errors:
            raise ValidationError(errors)
