from django import forms
from django.contrib import admin, messages

from console.catalog.admin_forms import ImageForm, MigProfileForm
from console.catalog.compatibility import cuda_support
from console.catalog.models import GpuModel, Image, MigProfile, Region, Spec, SpecPrice
from console.catalog.spec_fit import spec_fit


@admin.register(Region)
class RegionAdmin(admin.ModelAdmin):
    list_display = ["code", "name", "registry_mirror", "tenant_images"]
    search_fields = ["code", "name"]


class MigProfileInline(admin.TabularInline):
    model = MigProfile
    form = MigProfileForm
    extra = 0


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin):
    list_display = ["name", "code", "memory_mib", "mig_capable"]
    list_filter = ["mig_capable"]
    search_fields = ["name", "code"]
    inlines = [MigProfileInline]


# What a price point does, as the price admin states it (billing.metering.mark_repriced).
PRICE_CHANGE_RULE = (
    "The price from this moment on. A moment already past in the open month re-rates all of "
    "this month's usage of the spec from then on, on the usage page, the API, the budget and "
    "the invoice alike. An earlier month is invoiced, so it is refused: a correction there is "
    "a credit note."
)


class SpecPriceForm(forms.ModelForm):
    class Meta:
        model = SpecPrice
        fields = ["effective_from", "price_per_hour"]
        help_texts = {"effective_from": PRICE_CHANGE_RULE}


class SpecPriceInline(admin.TabularInline):
    """The price history: points are added, never edited or deleted (usage was billed and
    shown with them); a change takes effect from its time on (``PRICE_CHANGE_RULE``)."""

    model = SpecPrice
    form = SpecPriceForm
    extra = 0
    can_delete = False

    def has_change_permission(self, request, obj=None):
        return False


class SpecForm(forms.ModelForm):
    price_per_hour = forms.DecimalField(
        max_digits=10,
        decimal_places=4,
        min_value=0,
        help_text="The first price point; later changes are added as price points.",
    )

    class Meta:
        model = Spec
        fields = [
            "code",
            "name",
            "gpu_model",
            "mode",
            "gpu_count",
            "mig_profile",
            "milli",
            "gpu_memory_mib",
            "vcpus",
            "ram_mib",
            "disk_gib",
            "active",
        ]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.instance._state.adding:
            del self.fields["price_per_hour"]

    def save(self, commit=True):
        if "price_per_hour" in self.fields:
            self.instance.price_per_hour = self.cleaned_data["price_per_hour"]
        return super().save(commit)


@admin.register(Spec)
class SpecAdmin(admin.ModelAdmin):
    form = SpecForm
    list_display = [
        "code",
        "gpu_model",
        "mode",
        "gpu_count",
        "mig_profile",
        "milli",
        "current_price",
        "next_price_change",
        "active",
    ]
    list_filter = ["mode", "gpu_model", "active"]
    search_fields = ["code", "name"]
    inlines = [SpecPriceInline]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("prices")

    readonly_fields = ["hosts"]

    def get_fields(self, request, obj=None):
        fields = super().get_fields(request, obj)
        return [name for name in fields if obj is None or name != "price_per_hour"]

    @admin.display(description="Hosts that can hold it")
    def hosts(self, spec):
        if spec.pk is None:
            return "Checked against the hosts of each region when it is saved."
        return spec_fit(spec).summary()

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if warning := spec_fit(obj).warning():
            messages.warning(request, f"{obj}: {warning}")


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    form = ImageForm
    list_display = ["name", "reference", "cuda_version", "active", "pre_pull"]
    list_filter = ["active", "pre_pull", "cuda_version"]
    search_fields = ["name", "reference", "description"]
    readonly_fields = ["hosts"]

    def get_fields(self, request, obj=None):
        return [*ImageForm.Meta.fields, "hosts"]

    @admin.display(description="Hosts that run it")
    def hosts(self, image):
        if image.pk is None:
            return "Checked against the hosts' drivers when it is saved."
        return cuda_support(image.cuda_version).summary()

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if warning := cuda_support(obj.cuda_version).warning():
            messages.warning(request, f"{obj.name}: {warning}")
