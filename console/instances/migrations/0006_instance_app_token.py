from django.db import migrations, models

import console.instances.models


def one_token_each(apps, schema_editor):
    """The field's default is drawn once for the rows already there: give each its own."""
    Instance = apps.get_model("instances", "Instance")
    for instance in Instance.objects.only("pk"):
        instance.app_token = console.instances.models.new_app_token()
        instance.save(update_fields=["app_token"])


class Migration(migrations.Migration):
    dependencies = [
        ("instances", "0005_access"),
    ]

    operations = [
        migrations.AddField(
            model_name="instance",
            name="app_token",
            field=models.CharField(
                default=console.instances.models.new_app_token, editable=False, max_length=64
            ),
        ),
        migrations.RunPython(one_token_each, migrations.RunPython.noop),
    ]
