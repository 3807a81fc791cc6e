from django.contrib import admin

from console.audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """The whole log, for operators: read, never written."""

    list_display = ["at", "tenant_id", "actor", "action", "object_type", "object_repr", "address"]
    list_filter = ["action", "object_type"]
    search_fields = ["actor", "object_repr", "object_id", "tenant__slug"]
    date_hierarchy = "at"
    show_full_result_count = False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
