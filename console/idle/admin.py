"""Operators set each tenant's idle policy here; tenants see it in force and cannot weaken it.
The tenants' own levels are shown read-only."""

from django.contrib import admin
from django.utils import timezone

from console.idle.models import InstancePolicy, OperatorPolicy, TenantPolicy

POLICY_FIELDS = (
    "window_minutes",
    "threshold_percent",
    ("count_gpu", "count_ssh", "count_terminal", "count_ports"),
    "action",
    "warning_minutes",
    "allow_keep_running",
    "max_runtime_minutes",
)
LISTED = ("window_minutes", "threshold_percent", "action", "max_runtime_minutes", "updated_at")


@admin.register(OperatorPolicy)
class OperatorPolicyAdmin(admin.ModelAdmin):
    list_display = ("tenant", *LISTED, "allow_keep_running", "updated_by")
    search_fields = ("tenant__name", "tenant__slug")
    autocomplete_fields = ("tenant",)
    fields = ("tenant", *POLICY_FIELDS)

    def save_model(self, request, obj, form, change):
        obj.updated_by = request.user
        obj.updated_at = timezone.now()
        super().save_model(request, obj, form, change)


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(TenantPolicy)
class TenantPolicyAdmin(ReadOnly):
    list_display = ("tenant", *LISTED)
    search_fields = ("tenant__name", "tenant__slug")


@admin.register(InstancePolicy)
class InstancePolicyAdmin(ReadOnly):
    list_display = ("instance", *LISTED)
    search_fields = ("instance__name",)
