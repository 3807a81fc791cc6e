"""Tenants' instances, the events of their lives, and the GPU slices they hold."""

import secrets
import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from accounts.models import SshKey, Tenant
from console import secret_env
from console.catalog import registries
from console.catalog.models import Image, Mode, Region, RestartPolicy, Spec
from console.fleet.models import Gpu, Host
from console.instances import reasons


class State(models.TextChoices):
    PENDING = "pending", "Pending"
    PROVISIONING = "provisioning", "Provisioning"
    RUNNING = "running", "Running"
    # Its host went silent: its agent may still run it (billing stops at the last heartbeat
    # until the agent, heard again, shows that it did).
    UNREACHABLE = "unreachable", "Unreachable"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"
    STARTING = "starting", "Starting"
    REBOOTING = "rebooting", "Rebooting"
    TERMINATING = "terminating", "Terminating"
    TERMINATED = "terminated", "Terminated"
    FAILED = "failed", "Failed"


class OnHostLoss(models.TextChoices):
    """What an instance whose host is lost does (when its restart policy is not `never`): wait
    for the host, which holds its disk (`keep_disk`), or run again elsewhere on a new, empty
    disk (`fresh_disk`), its old disk left on the lost host."""

    KEEP_DISK = "keep_disk", "Keep its disk (wait for the host)"
    FRESH_DISK = "fresh_disk", "Run again elsewhere on a fresh disk"


def new_app_token() -> str:
    """A secret of the instance's own for the apps it serves that sign in with a token."""
    return secrets.token_urlsafe(32)


def new_disk_name() -> str:
    """The name of an instance's disk on its host: never one an earlier install (or an earlier
    database) gave an instance of the same id."""
    return f"gpucloud-{uuid.uuid4().hex}"


class InstanceQuerySet(models.QuerySet):
    def live(self) -> "InstanceQuerySet":
        """Not terminated (also through a relation: ``spec.instances.live()``, which lets the
        apps below this one ask without importing it)."""
        return self.exclude(state=State.TERMINATED)


class Instance(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="instances")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    name = models.CharField(max_length=63)
    spec = models.ForeignKey(Spec, on_delete=models.PROTECT, related_name="instances")
    # What it runs: a catalog image, or (image None) a reference of the tenant's own
    # (catalog/registries.py says which a region allows). `image_reference` is the reference
    # as launched; `image_digest` the digest of a tenant's reference's first pull, which every
    # later allocation pulls and runs (`pull_reference`), so a moved tag changes nothing.
    image = models.ForeignKey(
        Image, on_delete=models.PROTECT, null=True, blank=True, related_name="instances"
    )
    image_reference = models.CharField(max_length=255, blank=True)
    image_digest = models.CharField(max_length=80, blank=True)
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="instances")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    # Why it is in its state (reasons.Reason): a code, or none when the detail is words.
    state_reason_code = models.CharField(max_length=32, choices=reasons.Code.choices, blank=True)
    state_reason_detail = models.CharField(max_length=reasons.MAX_TEXT, blank=True)
    # While its image is pulled, how far the pull got (the agent's figures, as
    # console/instances/pull_progress.py keeps them); {} otherwise: every new reason clears it.
    pull_progress = models.JSONField(default=dict, blank=True)
    priority = models.SmallIntegerField(default=0, help_text="higher starts first when queued")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    terminated_at = models.DateTimeField(null=True, blank=True)
    # Set while a resize that could not happen in place stops the instance: when the stop is
    # done it starts again by itself, and its quota stays taken meanwhile (see quota.usage).
    resume_after_stop = models.BooleanField(default=False)
    # What the workload runs: the tenant's command (None: the image's default) and its
    # environment, laid over the image's default environment.
    command = models.JSONField(null=True, blank=True)
    env = models.JSONField(default=dict, blank=True)
    # Its secret environment, sealed ({NAME: token}, secret_env.seal): opened only into its
    # agent's request (placement.agent_body), shown to nobody.
    secret_env = models.JSONField(default=dict, blank=True)
    # Its disk (named disk_name, gpucloud-<uuid>; gpucloud-<pk> for instances older than the
    # name): sized at launch, on the host of its first placement, where it stays until
    # terminate; start and resize go back to that host.
    disk_name = models.CharField(max_length=64, unique=True, default=new_disk_name, editable=False)
    disk_gib = models.PositiveIntegerField(default=0)
    disk_host = models.ForeignKey(
        Host, on_delete=models.SET_NULL, null=True, blank=True, related_name="disks"
    )
    # How the workload ended by itself (the agent's report), None while it has not.
    exit_code = models.IntegerField(null=True, blank=True)
    # Who may open a shell in it (ssh, the browser terminal): the keys chosen at launch, of
    # members with role member or above (access.granted_keys), pushed to its host's agent.
    ssh_keys = models.ManyToManyField(SshKey, blank=True, related_name="instances")
    # Web ports the launch added to the image's ([{"port": 8080, "name": "app"}]).
    ports = models.JSONField(default=list, blank=True)
    # The token of the apps its image serves that sign in with one (a port with "app":
    # "jupyter"): given to every allocation of it (sign_in.token_env), so that it outlives stop,
    # start and a move, and put in its port links for members (sign_in.app_query).
    app_token = models.CharField(max_length=64, default=new_app_token, editable=False)
    # Whether it runs again after a failure (its image's policy unless the launch chose one),
    # and how when its host is lost (recovery.fail_over_hosts).
    restart_policy = models.CharField(
        max_length=12, choices=RestartPolicy.choices, default=RestartPolicy.ON_FAILURE
    )
    on_host_loss = models.CharField(
        max_length=12, choices=OnHostLoss.choices, default=OnHostLoss.KEEP_DISK
    )
    # Consecutive restarts after its workload ended by itself, and when the next one is due
    # while it waits for it (restarts.schedule).
    restart_count = models.PositiveIntegerField(default=0)
    restart_at = models.DateTimeField(null=True, blank=True)

    objects = InstanceQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "state"]), models.Index(fields=["state"])]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(image__isnull=False) | ~models.Q(image_reference=""),
                name="instance_runs_an_image",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"

    @property
    def is_live(self) -> bool:
        return self.state != State.TERMINATED

    @property
    def reference(self) -> str:
        """The image reference it was launched with (its catalog image's, or the tenant's)."""
        return self.image.reference if self.image is not None else self.image_reference

    @property
    def pull_reference(self) -> str:
        """What its allocations pull and run: a tenant's reference pinned to its digest once
        known (repository@sha256:…), else the reference."""
        return registries.pinned(self.reference, self.image_digest)

    @property
    def image_label(self) -> str:
        """Its image as the pages and the API name it: the catalog image's name, or the
        tenant's reference."""
        return self.image.name if self.image is not None else self.image_reference

    @property
    def image_command(self) -> list[str]:
        """Its image's default command ([]: the image's own CMD, always for a tenant's)."""
        return self.image.command if self.image is not None else []

    @property
    def image_env(self) -> dict[str, str]:
        return self.image.env if self.image is not None else {}

    @property
    def image_ports(self) -> list[dict]:
        return self.image.ports if self.image is not None else []

    @property
    def masked_secrets(self) -> dict[str, str]:
        """Its secret variables as anyone is shown them: names, each with the mask."""
        return secret_env.masked(self.secret_env)

    @property
    def reason(self) -> reasons.Reason:
        return reasons.Reason(self.state_reason_code, self.state_reason_detail)

    @property
    def state_reason(self) -> str:
        """Its reason as one line, as the API, the pages and its events say it."""
        return self.reason.text

    @staticmethod
    def reason_fields(reason: reasons.Reason | None, pull: dict | None = None) -> dict:
        """The columns that keep `reason` (None: no reason), for a save or an update, with the
        image pull's progress that goes with it (none unless given)."""
        kept = reason.fitted() if reason is not None else reasons.Reason()
        return {
            "state_reason_code": kept.code,
            "state_reason_detail": kept.detail,
            "pull_progress": pull or {},
        }

    def set_reason(self, reason: reasons.Reason | None, pull: dict | None = None) -> None:
        """Say why it is in its state without a transition (lifecycle.transition says it with
        one); `pull`: the figures of the image pull the reason reports."""
        fields = self.reason_fields(reason, pull)
        for name, value in fields.items():
            setattr(self, name, value)
        Instance.objects.filter(pk=self.pk).update(**fields)

    def current_allocation(self) -> "Allocation | None":
        """The allocation that holds the instance's slice now (None while it holds none)."""
        return self.allocations.filter(released_at__isnull=True).select_related("host").first()


class InstanceEvent(models.Model):
    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    actor_label = models.CharField(max_length=80, help_text="who: a username or 'system'")
    from_state = models.CharField(max_length=16, choices=State.choices, blank=True)
    to_state = models.CharField(max_length=16, choices=State.choices)
    message = models.CharField(max_length=300, blank=True)
    # The instance's spec as of this event: billing's repair rates a period with the spec it
    # had (a resize changes it). Empty on events older than this field.
    spec = models.ForeignKey(
        Spec, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    # Its disk's size as of this event: billing bills a disk that grew (a resize while
    # stopped) at its new size from then on. Empty on events older than this field.
    disk_gib = models.PositiveIntegerField(null=True, blank=True)
    # A start the platform made (its restart policy's, a resize's that stopped it, a failover's
    # onto a fresh disk): billing's run goes on, with no new minimum (a launch or a start the
    # tenant asked for begins a new one).
    continues_run = models.BooleanField(default=False)
    # A shelve done: its disk is in snapshots, on no host, until it is placed again; billing
    # bills no disk from here until then.
    shelved = models.BooleanField(default=False)

    class Meta:
        ordering = ["at", "pk"]

    def __str__(self) -> str:
        if self.kind == "note":
            return f"{self.instance_id}: note ({self.to_state}) {self.message}"
        return f"{self.instance_id}: {self.from_state or '∅'} → {self.to_state}"

    @property
    def kind(self) -> str:
        """created, transition, or note (an event that changes no state: from = to)."""
        if not self.from_state:
            return "created"
        return "note" if self.from_state == self.to_state else "transition"


class Allocation(models.Model):
    """An instance's slice on one host; the agent knows it by the same id."""

    id = models.CharField(primary_key=True, max_length=64)
    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="allocations")
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="allocations")
    mode = models.CharField(max_length=8, choices=Mode.choices)
    # The body of the agent's PUT /v1/allocations/{id}: fixed when placed, so that every
    # retry and redelivery sends the same request.
    request = models.JSONField(default=dict)
    vcpus = models.PositiveIntegerField(default=0)
    ram_mib = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["host", "released_at"])]

    def __str__(self) -> str:
        return self.id


class GpuClaim(models.Model):
    """One claim on a GPU. Whole GPUs and MIG instances claim numbered memory slices, and the
    unique (gpu, slot) constraint makes the database itself refuse a double allocation. Shared
    fractions claim no slot (NULL), and are summed under a lock of the GPU row."""

    allocation = models.ForeignKey(Allocation, on_delete=models.CASCADE, related_name="claims")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="claims")
    slot = models.PositiveSmallIntegerField(null=True, blank=True)
    milli = models.PositiveSmallIntegerField(default=0)
    memory_mib = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["gpu", "slot"], name="one_claim_per_slot")]

    def __str__(self) -> str:
        return (
            f"{self.gpu} slot {self.slot}" if self.slot is not None else f"{self.gpu} {self.milli}m"
        )
