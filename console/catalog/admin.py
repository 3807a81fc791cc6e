from django.contrib import admin

from console.catalog.models import GpuModel, Image, MigProfile, Region, Spec, SpecPrice


@admin.register(Region)
class RegionAdmin(admin.ModelAdmin):
    list_display = ["code", "name"]
    search_fields = ["code", "name"]


class MigProfileInline(admin.TabularInline):
    model = MigProfile
    extra = 0


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin):
    list_display = ["name", "code", "memory_mib", "mig_capable"]
    list_filter = ["mig_capable"]
    search_fields = ["name", "code"]
    inlines = [MigProfileInline]


class SpecPriceInline(admin.TabularInline):
    model = SpecPrice
    extra = 0


@admin.register(Spec)
class SpecAdmin(admin.ModelAdmin):
    list_display = [
        "code",
        "gpu_model",
        "mode",
        "gpu_count",
        "mig_profile",
        "milli",
        "price_per_hour",
        "active",
    ]
    list_filter = ["mode", "gpu_model", "active"]
    search_fields = ["code", "name"]
    inlines = [SpecPriceInline]


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = ["name", "reference", "cuda_version", "active"]
    list_filter = ["active", "cuda_version"]
    search_fields = ["name", "reference", "description"]
    fields = [
        "name",
        "reference",
        "cuda_version",
        "description",
        "command",
        "env",
        "ports",
        "active",
    ]
