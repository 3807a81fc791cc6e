"""{% volume_picker form %}: the launch form's volumes, the tenant's that no instance holds, each
to tick with a mount path beside it; those of the regions not chosen are hidden (the page's
script shows them when their region is chosen)."""

from django import template

from console.volumes import services
from console.volumes.models import Volume

register = template.Library()


@register.inclusion_tag("volumes/_picker.html")
def volume_picker(form) -> dict:
    region = str(form["region"].value() or "")
    picked = {str(ref) for ref in form["volumes"].value() or []}
    free = Volume.objects.filter(
        tenant=form.membership.tenant, deleted_at__isnull=True, instance__isnull=True
    ).select_related("region", "host")
    rows = [
        {
            "volume": volume,
            "here": volume.region.code == region,
            "picked": str(volume.pk) in picked,
            "mount_path": form.data.get(f"mount_path_{volume.pk}", ""),
            "default_mount_path": services.default_mount_path(volume),
        }
        for volume in free.order_by("name")
    ]
    return {
        "form": form,
        "rows": rows,
        "any_here": any(row["here"] for row in rows),
    }
