from django.contrib import admin, messages

from accounts import invitations, services
from accounts.models import ApiToken, Invitation, Membership, Quota, Tenant


class QuotaInline(admin.StackedInline):
    model = Quota
    can_delete = False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "status", "gpu_quota", "max_instances", "created_at"]
    list_filter = ["status"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["suspended_at"]
    inlines = [QuotaInline, MembershipInline]
    actions = ["suspend", "reactivate"]

    @admin.display(description="GPU quota")
    def gpu_quota(self, tenant):
        return tenant.quota.gpu_quota

    @admin.display(description="Max instances")
    def max_instances(self, tenant):
        return tenant.quota.max_instances

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("quota")

    @admin.action(description="Suspend selected tenants")
    def suspend(self, request, queryset):
        for tenant in queryset:
            services.set_tenant_status(tenant, Tenant.Status.SUSPENDED)
        self.message_user(request, f"Suspended {queryset.count()} tenant(s).", messages.SUCCESS)

    @admin.action(description="Reactivate selected tenants")
    def reactivate(self, request, queryset):
        for tenant in queryset:
            services.set_tenant_status(tenant, Tenant.Status.ACTIVE)
        self.message_user(request, f"Reactivated {queryset.count()} tenant(s).", messages.SUCCESS)


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = [
        "tenant",
        "gpu_quota",
        "max_instances",
        "storage_quota_gib",
        "monthly_budget",
        "budget_action",
    ]
    list_filter = ["budget_action"]
    search_fields = ["tenant__name", "tenant__slug"]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "user__email", "tenant__name", "tenant__slug"]
    autocomplete_fields = ["user", "tenant"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "prefix",
        "user",
        "tenant",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    ]
    list_filter = ["tenant"]
    search_fields = ["name", "prefix", "user__username", "tenant__slug"]
    readonly_fields = [
        "prefix",
        "token_hash",
        "last_used_at",
        "created_at",
        "scopes",
        "instance_prefix",
        "issued_by",
    ]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # tokens are issued by their users, shown once

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            services.revoke_token(token)
        self.message_user(request, f"Revoked {queryset.count()} token(s).", messages.SUCCESS)


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    list_display = ["email", "tenant", "role", "state", "invited_by", "created_at", "expires_at"]
    list_filter = ["tenant", "role"]
    search_fields = ["email", "tenant__slug"]
    readonly_fields = [field.name for field in Invitation._meta.fields if field.name != "id"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # sent by tenant admins from the Members page, the link only to the address

    @admin.action(description="Revoke selected invitations")
    def revoke(self, request, queryset):
        for invitation in queryset:
            invitations.revoke(invitation)
        self.message_user(request, f"Revoked {queryset.count()} invitation(s).", messages.SUCCESS)
