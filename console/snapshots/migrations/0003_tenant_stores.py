"""The snapshot store split per tenant: each tenant's own repository (TenantStore), and on
each snapshot the repository that holds it. Every snapshot taken before is in the shared
repository: marked `legacy`, its restores and forget go there."""

import uuid

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


def mark_legacy(apps, schema_editor):
    apps.get_model("snapshots", "Snapshot").objects.update(store="legacy")


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0006_api_token_scopes"),
        ("snapshots", "0002_volume_snapshots"),
    ]

    operations = [
        migrations.AddField(
            model_name="snapshot",
            name="store",
            field=models.CharField(
                choices=[
                    ("tenant", "Its tenant's repository"),
                    ("legacy", "The shared repository (taken before the split)"),
                ],
                default="tenant",
                help_text="the repository that holds it: its restores and forget go there",
                max_length=8,
            ),
        ),
        migrations.RunPython(mark_legacy, migrations.RunPython.noop, elidable=False),
        migrations.CreateModel(
            name="TenantStore",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("key", models.UUIDField(default=uuid.uuid4, editable=False, unique=True)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "tenant",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="snapshot_store",
                        to="accounts.tenant",
                    ),
                ),
            ],
        ),
    ]
