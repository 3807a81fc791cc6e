"""Host secrets are kept encrypted (sealed_secret) instead of in plain text."""

from django.db import migrations, models

from console.fleet.models import open_secret, seal_secret


def seal(apps, schema_editor):
    Host = apps.get_model("fleet", "Host")
    for host in Host.objects.only("pk", "secret"):
        Host.objects.filter(pk=host.pk).update(sealed_secret=seal_secret(host.secret))


def unseal(apps, schema_editor):
    Host = apps.get_model("fleet", "Host")
    for host in Host.objects.only("pk", "sealed_secret"):
        Host.objects.filter(pk=host.pk).update(secret=open_secret(host.sealed_secret))


class Migration(migrations.Migration):
    dependencies = [("fleet", "0002_host_secret_hash_gpu_details_events")]

    operations = [
        migrations.AddField(
            model_name="host",
            name="sealed_secret",
            field=models.TextField(default="", editable=False),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name="host",
            name="secret",
            field=models.CharField(blank=True, max_length=80),
        ),
        migrations.RunPython(seal, unseal),
        migrations.RemoveField(model_name="host", name="secret"),
    ]
