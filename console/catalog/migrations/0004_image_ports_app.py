from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("catalog", "0003_spec_price_history"),
    ]

    operations = [
        migrations.AlterField(
            model_name="image",
            name="ports",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text='ports it serves, e.g. [{"port": 8888, "name": "Jupyter", "app": '
                '"jupyter"}]; "app": "jupyter" gives each instance a token in JUPYTER_TOKEN and '
                "opens the port signed in with it",
            ),
        ),
    ]
