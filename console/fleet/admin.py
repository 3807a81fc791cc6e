from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.template.response import TemplateResponse
from django.utils.html import format_html

from console import integers
from console.catalog.models import Mode
from console.fleet import identity, services
from console.fleet.models import Gpu, Host, HostEvent, JoinToken


def _apply(modeladmin, request, objects, change, describe) -> None:
    """Run `change` on each object; one message for the successes, one per refusal."""
    done = 0
    for obj in objects:
        try:
            change(obj)
        except ValidationError as error:
            modeladmin.message_user(request, f"{obj}: {' '.join(error.messages)}", messages.ERROR)
        else:
            done += 1
    if done:
        modeladmin.message_user(request, f"{describe}: {done}.", messages.SUCCESS)


def _status_action(status: str, label: str):
    def action(modeladmin, request, queryset):
        if status in Host.ANNOUNCED and "confirmed" not in request.POST:
            # a page of its own first (as delete_selected's), with the note for the tenants
            context = {
                **modeladmin.admin_site.each_context(request),
                "title": f"{label} selected hosts?",
                "opts": modeladmin.model._meta,
                "hosts": queryset,
                "action": action.__name__,
                "status": status,
                "note_max_length": Host._meta.get_field("operator_note").max_length,
            }
            return TemplateResponse(request, "admin/fleet/host/confirm_status.html", context)
        note = request.POST.get("note", "")[: Host._meta.get_field("operator_note").max_length]
        _apply(
            modeladmin,
            request,
            queryset,
            lambda host: services.set_host_status(host, status, actor=request.user, note=note),
            f"{label}",
        )

    action.__name__ = f"set_{status}"
    return admin.action(description=f"{label} selected hosts")(action)


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    can_delete = False
    fields = ["index", "uuid", "model", "mode", "healthy", "health_reason", "memory_mib"]
    readonly_fields = fields
    ordering = ["index"]
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


class HostEventInline(admin.TabularInline):
    model = HostEvent
    extra = 0
    can_delete = False
    fields = ["at", "actor_label", "from_status", "to_status", "message"]
    readonly_fields = fields
    max_num = 0

    def get_queryset(self, request):
        return super().get_queryset(request).order_by("-at")


def _secret_action(revoke: bool):
    def action(modeladmin, request, queryset):
        _apply(
            modeladmin,
            request,
            queryset,
            lambda host: identity.rotate_secret(host, request.user, revoke=revoke),
            "Secrets revoked (the old ones no longer work)" if revoke else "Secrets rotated",
        )

    action.__name__ = "revoke_secret" if revoke else "rotate_secret"
    label = "Revoke the secret of" if revoke else "Rotate the secret of"
    return admin.action(description=f"{label} selected hosts")(action)


class HostForm(forms.ModelForm):
    """The one field an operator edits here: the agent's address (console/fleet/identity.py)."""

    class Meta:
        model = Host
        fields = ["address"]

    def clean_address(self):
        address = self.cleaned_data["address"].strip().rstrip("/")
        if address != self.instance.address:
            problem = identity.address_refusal(self.instance, address)
            if problem:
                raise ValidationError(problem)
        return address


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    form = HostForm
    list_display = [
        "name", "region", "status_badge", "admin_status", "gpu_count", "agent_version",
        "last_heartbeat_at", "address",
    ]  # fmt: skip
    list_filter = ["status", "admin_status", "region", "backend"]
    search_fields = ["name", "address", "gpus__uuid"]
    date_hierarchy = "registered_at"
    # Status goes through the actions (services.set_host_status); the rest is the agent's.
    readonly_fields = [
        "name", "region", "agent_version", "backend", "runtime", "vcpus", "ram_mib",
        "status", "admin_status", "operator_note", "status_changed_at", "last_heartbeat_at",
        "unreachable_since", "inventory_digest", "registered_at", "reported_address",
        "secret_rotated_at", "container_networks",
    ]  # fmt: skip
    inlines = [GpuInline, HostEventInline]
    actions = [
        _status_action(Host.Status.CORDONED, "Cordon"),
        _status_action(Host.Status.ACTIVE, "Uncordon / activate"),
        _status_action(Host.Status.DRAINING, "Drain"),
        _status_action(Host.Status.MAINTENANCE, "Maintenance for"),
        _status_action(Host.Status.RETIRED, "Retire"),
        _secret_action(revoke=False),
        _secret_action(revoke=True),
    ]

    def save_model(self, request, obj, form, change):
        """Only the address changes here, through identity.change_address (event, audit): the
        rest of the row is the agent's and the actions', never written back as read."""
        if "address" in form.changed_data:
            identity.change_address(Host.objects.get(pk=obj.pk), obj.address, request.user)

    def has_add_permission(self, request):
        return False  # hosts join through their agent, with a join token

    def get_queryset(self, request):
        from django.db.models import Count

        return super().get_queryset(request).select_related("region").annotate(n_gpus=Count("gpus"))

    @admin.display(description="GPUs", ordering="n_gpus")
    def gpu_count(self, host):
        return host.n_gpus

    @admin.display(description="Status", ordering="status")
    def status_badge(self, host):
        return format_html("<strong>{}</strong>", host.status)


def _mode_action(mode: str):
    def action(modeladmin, request, queryset):
        _apply(
            modeladmin,
            request,
            queryset.select_related("host", "model"),
            lambda gpu: services.set_gpu_mode(gpu, mode, actor=request.user),
            f"GPUs now in {mode} mode",
        )

    action.__name__ = f"set_mode_{mode}"
    return admin.action(description=f"Set selected GPUs to {mode} mode")(action)


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["__str__", "model", "mode", "healthy", "health_reason", "memory_mib", "uuid"]
    list_filter = ["mode", "healthy", "model", "host__region", "host__status"]
    search_fields = ["uuid", "host__name", "name", "pci_bus_id"]
    list_select_related = ["host", "model"]
    readonly_fields = [
        "host", "index", "uuid", "model", "name", "pci_bus_id", "memory_mib", "mode",
        "mig_enabled", "mig_devices", "driver_version", "cuda_version", "healthy",
        "health_reason", "health_changed_at",
    ]  # fmt: skip
    actions = [_mode_action(mode) for mode in Mode.values]

    def has_add_permission(self, request):
        return False  # GPUs come from their agent's inventory


class JoinTokenForm(forms.ModelForm):
    ttl_hours = integers.FormField(
        label="Valid for (hours)",
        min_value=1,
        max_value=services.JOIN_TOKEN_MAX_TTL_HOURS,
        required=False,
    )

    class Meta:
        model = JoinToken
        fields = ["region", "note"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["ttl_hours"].initial = settings.JOIN_TOKEN_TTL_HOURS


@admin.register(JoinToken)
class JoinTokenAdmin(admin.ModelAdmin):
    list_display = [
        "prefix",
        "region",
        "note",
        "state",
        "created_by",
        "created_at",
        "expires_at",
        "host",
    ]
    list_filter = ["region", ("used_at", admin.EmptyFieldListFilter)]
    search_fields = ["prefix", "note", "host__name"]
    list_select_related = ["region", "created_by", "host"]
    readonly_fields = [
        "prefix",
        "region",
        "note",
        "created_by",
        "created_at",
        "expires_at",
        "used_at",
        "host",
    ]
    actions = ["revoke"]

    def get_form(self, request, obj=None, **kwargs):
        if obj is None:
            kwargs["form"] = JoinTokenForm
        return super().get_form(request, obj, **kwargs)

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["region", "note", "ttl_hours"]
        return self.readonly_fields

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else self.readonly_fields

    def save_model(self, request, obj, form, change):
        if change:
            return  # a join token does not change once issued
        obj.created_by = request.user
        raw = services.issue_join_token(obj, form.cleaned_data.get("ttl_hours"))
        self.message_user(
            request,
            format_html(
                "Join token for {} created. Copy it now, it is not shown again: "
                "<code class='join-token'>{}</code>",
                obj.region.code,
                raw,
            ),
            messages.WARNING,
        )

    @admin.display(description="State")
    def state(self, token):
        return token.state

    @admin.action(description="Revoke selected unused tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            services.revoke_join_token(token)
        self.message_user(request, f"Revoked {queryset.count()} token(s).", messages.SUCCESS)


@admin.register(HostEvent)
class HostEventAdmin(admin.ModelAdmin):
    list_display = ["at", "host", "from_status", "to_status", "actor_label", "message"]
    list_filter = ["to_status", "host"]
    search_fields = ["host__name", "message", "actor_label"]
    list_select_related = ["host"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
