from django.db import migrations, models


def no_cuda_is_empty(apps, schema_editor):
    """The demo said "-" for an image without CUDA while the field was required."""
    apps.get_model("catalog", "Image").objects.filter(cuda_version="-").update(cuda_version="")


class Migration(migrations.Migration):
    dependencies = [
        ("catalog", "0005_image_restart_policy"),
    ]

    operations = [
        migrations.AlterField(
            model_name="image",
            name="cuda_version",
            field=models.CharField(
                blank=True,
                help_text="the CUDA version it was built for, e.g. 12.4: a host runs it when its "
                "driver supports that version or later; empty for an image without CUDA",
                max_length=16,
            ),
        ),
        migrations.RunPython(no_cuda_is_empty, migrations.RunPython.noop),
    ]
