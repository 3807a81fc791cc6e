"""What the API shows of snapshots and schedules, and what it takes."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console import integers
from console.snapshots.models import Restore, Schedule, Shelf, Snapshot


class SnapshotSerializer(serializers.ModelSerializer):
    instance = serializers.PrimaryKeyRelatedField(read_only=True)
    volume = serializers.PrimaryKeyRelatedField(read_only=True)
    percent = serializers.IntegerField(read_only=True)

    class Meta:
        model = Snapshot
        fields = [
            "id",
            "instance",
            "volume",
            "source_name",
            "kind",
            "state",
            "size_gib",
            "bytes_done",
            "bytes_total",
            "percent",
            "eta_seconds",
            "bytes_stored",
            "bytes_unique",
            "bytes_shared",
            "error",
            "created_at",
            "finished_at",
        ]
        read_only_fields = fields


class SnapshotCreateSerializer(serializers.Serializer):
    """What to snapshot: an instance's disk or a volume, one of the two."""

    instance = integers.Field(required=False, help_text="the instance whose disk to snapshot")
    volume = serializers.CharField(
        required=False, max_length=63, help_text="the volume to snapshot, by id or name"
    )

    def validate(self, attrs):
        if ("instance" in attrs) == ("volume" in attrs):
            message = "Give an instance or a volume, one of the two."
            raise serializers.ValidationError({"instance": [message], "volume": [message]})
        return attrs


class ScheduleCreateSerializer(SnapshotCreateSerializer):
    every_hours = integers.Field(min_value=1, max_value=24 * 30)
    keep = integers.Field(min_value=1, max_value=100)


class ScheduleSerializer(serializers.ModelSerializer):
    instance = serializers.PrimaryKeyRelatedField(read_only=True)
    volume = serializers.PrimaryKeyRelatedField(read_only=True)
    source_name = serializers.CharField(read_only=True)

    class Meta:
        model = Schedule
        fields = ["id", "instance", "volume", "source_name", "every_hours", "keep",
                  "last_run_at", "created_at"]  # fmt: skip
        read_only_fields = fields


class RestoreToVolumeSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63, help_text="the new volume's name")
    size_gib = integers.Field(
        required=False, min_value=1, help_text="default (and at least): the snapshot's size"
    )
    host = serializers.CharField(
        required=False, max_length=100,
        help_text="a host of the snapshot's region; default: one that takes new work",
    )  # fmt: skip


class VolumeRestoreSerializer(serializers.ModelSerializer):
    """A snapshot being restored into a new volume, with its progress."""

    volume_name = serializers.CharField(source="volume.name", read_only=True)
    host = serializers.SlugRelatedField(slug_field="name", read_only=True)
    percent = serializers.IntegerField(read_only=True)

    class Meta:
        model = Restore
        fields = ["id", "snapshot", "volume", "volume_name", "host", "state", "bytes_done",
                  "bytes_total", "percent", "eta_seconds", "error", "created_at",
                  "finished_at"]  # fmt: skip
        read_only_fields = fields


class RestoreSerializer(serializers.ModelSerializer):
    percent = serializers.IntegerField(read_only=True)

    class Meta:
        model = Restore
        fields = ["state", "bytes_done", "bytes_total", "percent", "eta_seconds", "error"]
        read_only_fields = fields


class ShelfSerializer(serializers.ModelSerializer):
    instance = serializers.PrimaryKeyRelatedField(read_only=True)
    snapshot = serializers.SerializerMethodField()
    restore = serializers.SerializerMethodField(help_text="the restore under way (unshelving)")

    class Meta:
        model = Shelf
        fields = ["instance", "state", "snapshot", "restore", "created_at", "shelved_at"]
        read_only_fields = fields

    def get_snapshot(self, shelf: Shelf) -> int | None:
        snapshot = shelf.snapshots.order_by("-pk").first()
        return snapshot.pk if snapshot else None

    @extend_schema_field(RestoreSerializer(allow_null=True))
    def get_restore(self, shelf: Shelf) -> dict | None:
        restore = shelf.restores.order_by("-pk").first()
        return RestoreSerializer(restore).data if restore else None
