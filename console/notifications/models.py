"""Where a tenant hears of what happened: its endpoints (an email address, a Slack-compatible
incoming webhook, or its own signed webhook), each subscribed to some kinds of notice; the
notices recorded for them; one delivery per notice and endpoint; and the log of every attempt
of a delivery."""

import uuid

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone

from accounts.models import Tenant

# A "send test" delivery: its endpoint alone receives it, whatever it subscribed to.
TEST_KIND = "notifications.test"


class Endpoint(models.Model):
    class Channel(models.TextChoices):
        EMAIL = "email", "Email"
        SLACK = "slack", "Slack-compatible webhook"
        WEBHOOK = "webhook", "Signed webhook"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="endpoints")
    name = models.CharField(max_length=64)
    channel = models.CharField(max_length=16, choices=Channel.choices)
    # an email address, or the URL notices are POSTed to
    target = models.CharField(max_length=500)
    kinds = models.JSONField(default=list)
    enabled = models.BooleanField(default=True)
    # webhooks: the signing secret, sealed (console.notifications.signing); during a rotation's
    # grace period the previous one signs too, until previous_secret_expires_at
    secret_sealed = models.TextField(blank=True)
    previous_secret_sealed = models.TextField(blank=True)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "pk"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="endpoint_name_per_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.channel})"


class Notice(models.Model):
    """One thing that happened, as every endpoint that receives it is told it."""

    event_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="notices")
    kind = models.CharField(max_length=64)
    text = models.CharField(max_length=1000)
    data = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    # what it is about: {"type": "instance", "id": 12, "name": "gpu-a"}, or null
    subject = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.text}"


class Delivery(models.Model):
    """A notice on its way to one endpoint: pending (with when its next attempt is due),
    delivered, or failed (given up on after the retry window, or refused outright)."""

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"

    notice = models.ForeignKey(Notice, on_delete=models.CASCADE, related_name="deliveries")
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="deliveries")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    # when the sweep queues it again: the next retry, or the end of a running attempt's lease
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.UniqueConstraint(fields=["notice", "endpoint"], name="one_delivery_per_endpoint")
        ]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="delivery_due")]

    def __str__(self) -> str:
        return f"{self.notice.kind} to {self.endpoint.name}: {self.state}"


class Attempt(models.Model):
    """One try of a delivery: the endpoint's delivery log."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="log")
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    at = models.DateTimeField(default=timezone.now)
    ok = models.BooleanField(default=False)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField(default=0)
    response_excerpt = models.CharField(max_length=500, blank=True)
    error = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["endpoint", "-at"], name="attempt_endpoint_at")]

    def __str__(self) -> str:
        return f"attempt {self.number} of delivery {self.delivery_id}"
