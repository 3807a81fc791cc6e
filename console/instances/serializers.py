from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.catalog.models import MAX_ARGS, MAX_VALUE, Image, Region, Spec, env_errors
from console.instances import lifecycle, placement
from console.instances.models import Instance, InstanceEvent


class DiskSerializer(serializers.Serializer):
    size_gib = serializers.IntegerField()
    host = serializers.CharField(allow_null=True)


class InstanceSerializer(serializers.ModelSerializer):
    spec = serializers.SlugRelatedField(slug_field="code", read_only=True)
    image = serializers.SlugRelatedField(slug_field="name", read_only=True)
    region = serializers.SlugRelatedField(slug_field="code", read_only=True)
    gpu_equivalents = serializers.DecimalField(
        source="spec.gpu_equivalents", max_digits=8, decimal_places=3, normalize_output=True
    )
    price_per_hour = serializers.DecimalField(
        source="spec.current_price", max_digits=10, decimal_places=4, normalize_output=True
    )
    image_reference = serializers.CharField(source="image.reference", read_only=True)
    disk = serializers.SerializerMethodField()
    actions = serializers.SerializerMethodField()
    placement = serializers.SerializerMethodField()

    class Meta:
        model = Instance
        fields = [
            "id",
            "name",
            "state",
            "state_reason",
            "spec",
            "image",
            "image_reference",
            "command",
            "env",
            "exit_code",
            "disk",
            "region",
            "gpu_equivalents",
            "price_per_hour",
            "actions",
            "created_at",
            "updated_at",
            "terminated_at",
            "placement",
        ]
        read_only_fields = fields

    @extend_schema_field(DiskSerializer)
    def get_disk(self, instance) -> dict:
        """Its disk: the size, and the host that holds it (null before its first start)."""
        host = instance.disk_host
        return {"size_gib": instance.disk_gib, "host": host.name if host else None}

    def get_actions(self, instance) -> list[str]:
        return lifecycle.allowed_actions(instance.state)

    def get_placement(self, instance) -> dict | None:
        """Host, GPUs and slice: operators (staff) only."""
        request = self.context.get("request")
        if request is None or not request.user.is_staff:
            return None
        current = next((a for a in instance.allocations.all() if a.released_at is None), None)
        return placement.describe(current) if current else None


class LaunchSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    spec = serializers.SlugRelatedField(slug_field="code", queryset=Spec.objects.all())
    image = serializers.SlugRelatedField(slug_field="name", queryset=Image.objects.all())
    region = serializers.SlugRelatedField(
        slug_field="code", queryset=Region.objects.all(), required=False, allow_null=True
    )
    command = serializers.ListField(
        child=serializers.CharField(max_length=MAX_VALUE, allow_blank=True, trim_whitespace=False),
        min_length=1,
        max_length=MAX_ARGS,
        required=False,
        allow_null=True,
        help_text="What the workload runs instead of the image's default command.",
    )
    env = serializers.DictField(
        child=serializers.CharField(max_length=MAX_VALUE, allow_blank=True, trim_whitespace=False),
        required=False,
        help_text="Environment variables, laid over the image's defaults.",
    )

    def validate_env(self, env):
        problems = env_errors(env)
        if problems:
            raise serializers.ValidationError(problems)
        return env


class LogsSerializer(serializers.Serializer):
    instance = serializers.IntegerField()
    lines = serializers.ListField(child=serializers.CharField())


class ResizeSerializer(serializers.Serializer):
    spec = serializers.SlugRelatedField(slug_field="code", queryset=Spec.objects.all())


class InstanceEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")

    class Meta:
        model = InstanceEvent
        fields = ["at", "actor", "from_state", "to_state", "message"]
