"""One price source: every spec gets a price point (its price so far, from now on; the
first point also covers the time before it, so nothing already used is re-priced), then
the spec's own price column goes away."""

from django.db import migrations, models
from django.utils import timezone


def give_every_spec_a_price(apps, schema_editor):
    Spec = apps.get_model("catalog", "Spec")
    SpecPrice = apps.get_model("catalog", "SpecPrice")
    now = timezone.now()
    SpecPrice.objects.bulk_create(
        SpecPrice(spec_id=pk, effective_from=now, price_per_hour=price)
        for pk, price in Spec.objects.filter(prices__isnull=True).values_list(
            "pk", "price_per_hour"
        )
    )


def price_in_force_back_on_the_spec(apps, schema_editor):
    Spec = apps.get_model("catalog", "Spec")
    SpecPrice = apps.get_model("catalog", "SpecPrice")
    now = timezone.now()
    for spec in Spec.objects.all():
        points = SpecPrice.objects.filter(spec=spec).order_by("effective_from")
        point = points.filter(effective_from__lte=now).last() or points.first()
        spec.price_per_hour = point.price_per_hour
        spec.save(update_fields=["price_per_hour"])


class Migration(migrations.Migration):
    dependencies = [
        ("catalog", "0002_image_reference_command_env_ports"),
    ]

    operations = [
        migrations.AlterField(
            model_name="spec",
            name="price_per_hour",
            field=models.DecimalField(decimal_places=4, max_digits=10, null=True),
        ),
        migrations.RunPython(give_every_spec_a_price, price_in_force_back_on_the_spec),
        migrations.AlterModelOptions(
            name="spec",
            options={"ordering": ["gpu_model__name", "mode", "gpu_count", "milli", "code"]},
        ),
        migrations.RemoveField(model_name="spec", name="price_per_hour"),
    ]
