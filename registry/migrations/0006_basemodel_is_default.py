# Several base models are served at once (each by its own replicas): the one flag that
# marked "the" served model now marks the default one.
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0005_evaluations"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="basemodel", name="one_served_base_model"),
        migrations.RenameField(model_name="basemodel", old_name="is_served", new_name="is_default"),
        migrations.AlterField(
            model_name="basemodel",
            name="is_default",
            field=models.BooleanField(
                default=False,
                help_text="adapters created without naming a base model go on this one",
            ),
        ),
        migrations.AddConstraint(
            model_name="basemodel",
            constraint=models.UniqueConstraint(
                condition=models.Q(("is_default", True)),
                fields=("is_default",),
                name="one_default_base_model",
            ),
        ),
    ]
