"""Instances keep their secret env sealed (secret_env). What existing instances hold in plain env
under a credential's name (HF_TOKEN, …) is sealed there too, and taken out of the agent
requests their allocations keep: the requests get the secrets only when they are sent."""

from django.db import migrations, models

from console import secret_env as sealing


def seal_credentials(apps, schema_editor):
    Instance = apps.get_model("instances", "Instance")
    Allocation = apps.get_model("instances", "Allocation")
    for instance in Instance.objects.exclude(env={}).only("pk", "env", "secret_env"):
        plain, secret = sealing.split(instance.env, {})
        if not secret:
            continue
        instance.env = plain
        instance.secret_env = {**instance.secret_env, **sealing.seal(secret)}
        instance.save(update_fields=["env", "secret_env"])
        for allocation in Allocation.objects.filter(instance_id=instance.pk):
            env = allocation.request.get("env") or {}
            allocation.request["env"] = {k: v for k, v in env.items() if k not in secret}
            allocation.save(update_fields=["request"])


class Migration(migrations.Migration):
    dependencies = [
        ("instances", "0011_event_disk_gib"),
    ]

    operations = [
        migrations.AddField(
            model_name="instance",
            name="secret_env",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.RunPython(seal_credentials, migrations.RunPython.noop),
    ]
