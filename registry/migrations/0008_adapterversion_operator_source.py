# The folder or s3:// prefix an operator registered a version's files from is the deployment's,
# not the tenant's: it moves from `source` (which the tenant reads in the API, the pages and
# its audit trail) to `operator_source`, and the tenant sees `operator`. Versions registered
# before are moved, and their audit events say `operator` too.
from django.db import migrations, models

OPERATOR = "operator"
UPLOAD = "upload"


def _by_operator(actor: str) -> bool:
    """The operator token, a staff session on the operator endpoints, or start-up's modules."""
    return actor == OPERATOR or actor.startswith(("operator:", "admin:"))


def move_operator_sources(apps, schema_editor):
    AdapterVersion = apps.get_model("registry", "AdapterVersion")
    AuditEvent = apps.get_model("audit", "AuditEvent")
    paths = set()
    registered = AdapterVersion.objects.exclude(source__in=[UPLOAD, OPERATOR])
    for version in registered.iterator():
        if _by_operator(version.created_by):
            paths.add(version.source)
            version.operator_source, version.source = version.source, OPERATOR
            version.save(update_fields=["source", "operator_source"])
    for event in AuditEvent.objects.filter(object_type="adapter_version").iterator():
        changed = False
        for state in (event.before, event.after):
            if not isinstance(state, dict) or state.get("source") in (None, UPLOAD, OPERATOR):
                continue
            if state["source"] in paths or _by_operator(event.actor):
                state["source"] = OPERATOR
                changed = True
        if changed:
            event.save(update_fields=["before", "after"])


def restore_operator_sources(apps, schema_editor):
    AdapterVersion = apps.get_model("registry", "AdapterVersion")
    for version in AdapterVersion.objects.exclude(operator_source="").iterator():
        version.source = version.operator_source
        version.save(update_fields=["source"])


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0007_quantized_bases"),
        ("audit", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="adapterversion",
            name="operator_source",
            field=models.CharField(
                blank=True,
                default="",
                help_text="the folder or s3:// prefix an operator registered the files from; "
                "for operators only, never shown to the tenant",
                max_length=1100,
            ),
        ),
        migrations.AlterField(
            model_name="adapterversion",
            name="source",
            field=models.CharField(
                help_text="'upload', the s3:// prefix the tenant imported, or 'operator' (the "
                "files an operator registered: operator_source says from where)",
                max_length=1100,
            ),
        ),
        migrations.RunPython(move_operator_sources, restore_operator_sources),
    ]
