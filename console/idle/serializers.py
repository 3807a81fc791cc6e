"""The idle policies as the API reads and writes them."""

from django.db import models
from rest_framework import serializers

from console import integers
from console.idle.models import TenantPolicy

POLICY_FIELDS = (
    "window_minutes",
    "threshold_percent",
    "count_gpu",
    "count_ssh",
    "count_terminal",
    "count_ports",
    "action",
    "warning_minutes",
    "allow_keep_running",
    "max_runtime_minutes",
)


class Minutes(serializers.DecimalField):
    """Minutes as the schema gives them, a decimal string ("0.5"), never a JSON number."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class PolicySerializer(serializers.ModelSerializer):
    """One level's policy. Fields left out of a PUT keep their value (a new policy: the
    defaults). `window_minutes` empty: no idle rule at this level; `max_runtime_minutes`
    empty: no limit. Minutes take fractions (0.05 = 3 s)."""

    class Meta:
        model = TenantPolicy
        fields = POLICY_FIELDS
        extra_kwargs = {name: {"required": False} for name in POLICY_FIELDS}

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.DecimalField: Minutes,
        models.PositiveSmallIntegerField: integers.Field,
    }


class TenantPolicyAnswer(serializers.Serializer):
    policy = PolicySerializer(allow_null=True, help_text="the tenant's default; null: none")
    operator_policy = PolicySerializer(
        allow_null=True, help_text="the operator's policy for the tenant, which no level weakens"
    )


class InstancePolicyAnswer(serializers.Serializer):
    policy = PolicySerializer(allow_null=True, help_text="the instance's own; null: none")
    in_force = PolicySerializer(
        allow_null=True, help_text="the strictest of the operator's, the tenant's and its own"
    )
    summary = serializers.CharField(help_text="the policy in force in words")
    kind = serializers.CharField(
        help_text="what it would act for next: idle, max_runtime, or empty (nothing due)"
    )
    acts_at = serializers.DateTimeField(
        allow_null=True, help_text="when it acts if nothing changes (null: nothing due)"
    )
    acts_in_seconds = serializers.IntegerField(allow_null=True)
    warned = serializers.BooleanField(help_text="a warning is out")
    can_keep_running = serializers.BooleanField(
        help_text="POST keep-running/ would put the warned action off"
    )
