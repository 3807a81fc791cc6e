from rest_framework import serializers

from console import integers
from console.catalog.models import Region
from console.volumes import services
from console.volumes.models import Volume


class VolumeSerializer(serializers.ModelSerializer):
    region = serializers.SlugRelatedField(slug_field="code", read_only=True)
    host = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    instance = serializers.PrimaryKeyRelatedField(read_only=True, allow_null=True)
    kept_from = serializers.PrimaryKeyRelatedField(read_only=True, allow_null=True)
    price_per_month = serializers.DecimalField(
        max_digits=14, decimal_places=2, read_only=True,
        help_text="what it costs a month (size × price per GiB-month)",
    )  # fmt: skip

    class Meta:
        model = Volume
        fields = [
            "id", "name", "size_gib", "region", "state", "host", "instance", "mount_path",
            "kept_from", "price_per_gib_month", "price_per_month", "created_at",
        ]  # fmt: skip
        read_only_fields = fields


class VolumeCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    size_gib = integers.Field(min_value=1, max_value=services.MAX_SIZE_GIB)
    region = serializers.SlugRelatedField(
        slug_field="code", queryset=Region.objects.all(), required=False, allow_null=True,
        help_text="A region's code; default: the first region.",
    )  # fmt: skip


class AttachSerializer(serializers.Serializer):
    instance = integers.Field(help_text="A stopped instance of yours, by id.")
    mount_path = serializers.CharField(
        max_length=200, required=False, help_text="Default: /mnt/<the volume's name>."
    )


class PriceSerializer(serializers.Serializer):
    region = serializers.CharField()
    size_gib = serializers.IntegerField()
    price_per_gib_month = serializers.DecimalField(max_digits=12, decimal_places=6)
    price_per_month = serializers.DecimalField(max_digits=14, decimal_places=2)
