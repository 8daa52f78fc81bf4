# A quantized checkpoint (FP8, 4 or 8-bit) is another revision of its base: its scheme is
# recorded on the base model, and on each evaluation beside the revision it measured.
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0006_basemodel_is_default"),
    ]

    operations = [
        migrations.AddField(
            model_name="basemodel",
            name="quantization",
            field=models.CharField(
                blank=True,
                default="",
                help_text="the revision's quantization scheme (fp8-dynamic, w4a16-g128, ...); "
                "blank: weights in a float dtype",
                max_length=64,
            ),
        ),
        migrations.AddField(
            model_name="evaluation",
            name="base_quantization",
            field=models.CharField(
                blank=True,
                default="",
                help_text="that revision's quantization scheme",
                max_length=64,
            ),
        ),
    ]
