"""Operators publish templates here (`public`): every tenant sees a published template and
launches from it. Secrets are never shown, here neither: only their names."""

from django.contrib import admin

from console import secret_env
from console.launch_templates.models import LaunchTemplate
from console.launch_templates.services import FIELDS


@admin.register(LaunchTemplate)
class LaunchTemplateAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "public", "spec", "image", "updated_at"]
    list_filter = ["public", "spec"]
    search_fields = ["name", "tenant__slug", "tenant__name"]
    list_select_related = ["tenant", "spec", "image"]
    fields = ["tenant", "name", "description", "public", *FIELDS]
    readonly_fields = ["secrets"]

    def save_model(self, request, obj, form, change):
        """Env names that look like credentials are sealed, as everywhere else."""
        obj.env, moved = secret_env.split(obj.env, {})
        obj.secret_env = {**obj.secret_env, **secret_env.seal(moved)}
        super().save_model(request, obj, form, change)

    @admin.display(description="Secrets")
    def secrets(self, template) -> str:
        return ", ".join(f"{name}={mask}" for name, mask in template.masked_secrets.items())
