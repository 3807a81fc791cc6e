# The validators end at the end of the value (\Z): `$` also matches before a trailing newline.

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("catalog", "0008_region_registry_mirror_image_pre_pull"),
    ]

    operations = [
        migrations.AlterField(
            model_name="region",
            name="registry_mirror",
            field=models.CharField(
                blank=True,
                help_text="host[:port] of a registry mirror its hosts pull through first, e.g. "
                "127.0.0.1:5001; empty: each image's own registry",
                max_length=255,
                validators=[
                    django.core.validators.RegexValidator(
                        "^[A-Za-z0-9][A-Za-z0-9.-]{0,252}(:[0-9]{1,5})?\\Z",
                        "A registry's host[:port], e.g. mirror.internal:5000 (no scheme, no path).",
                    )
                ],
            ),
        ),
        migrations.AlterField(
            model_name="spec",
            name="code",
            field=models.CharField(
                max_length=60,
                unique=True,
                validators=[
                    django.core.validators.RegexValidator(
                        "^[a-z0-9][a-z0-9._-]*\\Z",
                        "Lower-case letters, digits, dots, dashes and underscores only.",
                    )
                ],
            ),
        ),
    ]
