"""Operators read instances here; state changes go through the console and the API (the
services), so the admin edits only the queue priority."""

from django.contrib import admin

from console.instances.models import Allocation, GpuClaim, Instance, InstanceEvent


class InstanceEventInline(admin.TabularInline):
    model = InstanceEvent
    extra = 0
    can_delete = False
    fields = ["at", "actor_label", "from_state", "to_state", "message"]
    readonly_fields = fields
    ordering = ["-at", "-pk"]

    def has_add_permission(self, request, obj=None):
        return False


class AllocationInline(admin.TabularInline):
    model = Allocation
    extra = 0
    can_delete = False
    fields = ["id", "host", "mode", "request", "created_at", "released_at"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Instance)
class InstanceAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "spec", "region", "state", "priority", "created_at"]
    list_filter = ["state", "region", "spec__mode"]
    search_fields = ["name", "tenant__slug", "tenant__name"]
    list_select_related = ["tenant", "spec", "region"]
    fields = [
        "tenant",
        "name",
        "spec",
        "image",
        "region",
        "state",
        "state_reason",
        "priority",
        "created_by",
        "created_at",
        "updated_at",
        "terminated_at",
    ]
    readonly_fields = [f for f in fields if f != "priority"]
    inlines = [AllocationInline, InstanceEventInline]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class GpuClaimInline(admin.TabularInline):
    model = GpuClaim
    extra = 0
    can_delete = False
    fields = ["gpu", "slot", "milli", "memory_mib"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = ["id", "instance", "host", "mode", "created_at", "released_at"]
    list_filter = ["mode", "host"]
    search_fields = ["id", "instance__name"]
    list_select_related = ["instance", "host"]
    readonly_fields = [
        "id",
        "instance",
        "host",
        "mode",
        "request",
        "vcpus",
        "ram_mib",
        "created_at",
        "released_at",
    ]
    inlines = [GpuClaimInline]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False
