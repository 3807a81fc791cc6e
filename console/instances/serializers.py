from rest_framework import serializers

from console.catalog.models import Image, Region, Spec
from console.instances import lifecycle, placement
from console.instances.models import Instance, InstanceEvent


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


class ResizeSerializer(serializers.Serializer):
    spec = serializers.SlugRelatedField(slug_field="code", queryset=Spec.objects.all())


class InstanceEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")

    class Meta:
        model = InstanceEvent
        fields = ["at", "actor", "from_state", "to_state", "message"]
