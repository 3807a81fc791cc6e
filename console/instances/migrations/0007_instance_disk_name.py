from django.db import migrations, models

import console.instances.models


def names_of_existing_disks(apps, schema_editor):
    """The instances already there keep the name their disk has on its host."""
    Instance = apps.get_model("instances", "Instance")
    for instance in Instance.objects.only("pk"):
        instance.disk_name = f"gpucloud-{instance.pk}"
        instance.save(update_fields=["disk_name"])


class Migration(migrations.Migration):
    dependencies = [
        ("instances", "0006_instance_app_token"),
    ]

    operations = [
        migrations.AddField(
            model_name="instance",
            name="disk_name",
            field=models.CharField(
                default=console.instances.models.new_disk_name, editable=False, max_length=64
            ),
        ),
        migrations.RunPython(names_of_existing_disks, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="instance",
            name="disk_name",
            field=models.CharField(
                default=console.instances.models.new_disk_name,
                editable=False,
                max_length=64,
                unique=True,
            ),
        ),
    ]
