from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.catalog import registries
from console.catalog.models import Image, Region, Spec, SpecPrice


class RegionSerializer(serializers.ModelSerializer):
    allowed_registries = serializers.SerializerMethodField(
        help_text="the registries (host[:port]) a launch's image_ref may name here, the "
        "registry mirror among them; empty: any"
    )

    class Meta:
        model = Region
        fields = ["code", "name", "tenant_images", "allowed_registries"]

    def get_allowed_registries(self, region) -> list[str]:
        return registries.allowed_registries(region)


class ImageAvailabilitySerializer(serializers.Serializer):
    status = serializers.CharField(
        help_text="held: hosts of the region hold it (or run workloads without images); "
        "mirror: the region's registry mirror serves it; registry: pulled from its own "
        "registry; unreachable: no host reaches its registry (nor the mirror); not_built: a "
        "localhost/ image no host holds. The last two cannot be launched there.",
    )
    launchable = serializers.BooleanField()
    detail = serializers.CharField(help_text="where it comes from, or why it cannot, in words")
    size_bytes = serializers.IntegerField(
        allow_null=True, help_text="its size where a host holds it; null otherwise"
    )
    hosts = serializers.ListField(
        child=serializers.CharField(), help_text="the hosts that start it without a pull"
    )


class ImageSerializer(serializers.ModelSerializer):
    availability = serializers.SerializerMethodField()

    class Meta:
        model = Image
        fields = [
            "name",
            "reference",
            "cuda_version",
            "description",
            "command",
            "env",
            "ports",
            "restart_policy",
            "availability",
        ]

    @extend_schema_field(ImageAvailabilitySerializer(allow_null=True))
    def get_availability(self, image) -> dict | None:
        """Where it can come from in the `region` asked for; null without `region`."""
        fleet = self.context.get("image_availability")
        return fleet.of(image.reference).as_dict() if fleet is not None else None


class PriceChangeSerializer(serializers.ModelSerializer):
    price_per_hour = serializers.DecimalField(
        max_digits=10, decimal_places=4, normalize_output=True
    )

    class Meta:
        model = SpecPrice
        fields = ["effective_from", "price_per_hour"]


class AvailabilitySerializer(serializers.Serializer):
    # a plain string in the schema: an enum named "status" would collide with the invoices' one
    status = serializers.CharField(
        help_text="fits_now: a slice is free now; queues: the region has the hardware but it "
        "is busy; no_hardware: no host of the region could hold it; over_quota: it alone "
        "exceeds your quota. The last two cannot be launched there.",
    )
    launchable = serializers.BooleanField()
    detail = serializers.CharField(help_text="the reason, in words")


class SpecSerializer(serializers.ModelSerializer):
    gpu_model = serializers.CharField(source="gpu_model.code")
    gpu_model_name = serializers.CharField(source="gpu_model.name")
    mig_profile = serializers.CharField(source="mig_profile.name", default=None, allow_null=True)
    gpu_equivalents = serializers.DecimalField(
        max_digits=8, decimal_places=3, normalize_output=True
    )
    price_per_hour = serializers.DecimalField(
        source="current_price",
        max_digits=10,
        decimal_places=4,
        normalize_output=True,
        help_text="the price in force now",
    )
    next_price_change = PriceChangeSerializer(
        read_only=True, allow_null=True, help_text="the next scheduled price, if any"
    )
    availability = serializers.SerializerMethodField()

    class Meta:
        model = Spec
        fields = [
            "code",
            "name",
            "mode",
            "gpu_model",
            "gpu_model_name",
            "gpu_count",
            "mig_profile",
            "milli",
            "gpu_equivalents",
            "gpu_memory_mib",
            "vcpus",
            "ram_mib",
            "disk_gib",
            "price_per_hour",
            "next_price_change",
            "availability",
        ]

    @extend_schema_field(AvailabilitySerializer(allow_null=True))
    def get_availability(self, spec) -> dict | None:
        """What launching it in the `region` asked for does for your tenant; null without
        `region`."""
        checker = self.context.get("availability")
        if checker is None:
            return None
        found = checker.of(spec)
        return {"status": found.status, "launchable": found.launchable, "detail": found.detail}
