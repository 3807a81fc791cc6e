from django.contrib import admin

from console.registry_credentials.models import RegistryCredential


@admin.register(RegistryCredential)
class RegistryCredentialAdmin(admin.ModelAdmin):
    """Operators see who holds a credential for which registry, never its token."""

    list_display = ["tenant", "registry", "username", "created_at", "last_used_at"]
    fields = readonly_fields = ("tenant", "registry", "username", "created_at", "last_used_at")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
