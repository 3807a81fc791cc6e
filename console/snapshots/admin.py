"""Snapshots, restores, schedules and shelves for operators: to look at, not to edit (every
change goes through console.snapshots.services)."""

from django.contrib import admin

from console.snapshots.models import Restore, Schedule, Shelf, Snapshot, StoreMeasurement


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Snapshot)
class SnapshotAdmin(ReadOnly):
    list_display = ("id", "tenant", "source_name", "kind", "state", "store", "bytes_stored",
                    "bytes_unique", "bytes_shared", "host", "created_at", "deleted_at")  # fmt: skip
    list_filter = ("state", "kind", "store")
    search_fields = ("source_name", "restic_id")


@admin.register(Restore)
class RestoreAdmin(ReadOnly):
    list_display = ("id", "snapshot", "instance", "volume", "host", "state", "created_at",
                    "finished_at")  # fmt: skip
    list_filter = ("state",)


@admin.register(Shelf)
class ShelfAdmin(ReadOnly):
    list_display = ("instance", "state", "host", "created_at", "shelved_at")
    list_filter = ("state",)


@admin.register(Schedule)
class ScheduleAdmin(ReadOnly):
    list_display = ("instance", "volume", "tenant", "every_hours", "keep", "last_run_at")


@admin.register(StoreMeasurement)
class StoreMeasurementAdmin(ReadOnly):
    """What tenants' repositories held: what their snapshot storage is billed from, kept."""

    list_display = ("tenant", "measured_at", "bytes", "price_per_gib_month")
    list_filter = ("tenant",)

    def has_delete_permission(self, request, obj=None):
        return False
