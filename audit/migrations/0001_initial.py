"""AuditEvent moves here from registry, keeping every row.

Registry's 0001 created the table as registry_auditevent. This migration takes the model
over in Django's state only (no SQL), then renames the table and its index for real, and
moves the content type so admin permissions and log entries follow the model.
registry/migrations/0002 then drops the model from registry's state, again without SQL.
"""

import django.db.models.deletion
from django.db import migrations, models


def move_content_type(apps, schema_editor, *, old="registry", new="audit"):
    ContentType = apps.get_model("contenttypes", "ContentType")
    types = ContentType.objects.using(schema_editor.connection.alias)
    if not types.filter(app_label=new, model="auditevent").exists():
        types.filter(app_label=old, model="auditevent").update(app_label=new)


def move_content_type_back(apps, schema_editor):
    move_content_type(apps, schema_editor, old="audit", new="registry")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('contenttypes', '0002_remove_content_type_name'),
        ('registry', '0001_initial'),
        ('tenants', '0002_usage_record'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='AuditEvent',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('actor', models.CharField(help_text='user:<name>, key:<prefix> or system:<part>', max_length=100)),
                        ('verb', models.CharField(max_length=64)),
                        ('object_type', models.CharField(max_length=32)),
                        ('object_repr', models.CharField(max_length=200)),
                        ('before', models.JSONField(blank=True, null=True)),
                        ('after', models.JSONField(blank=True, null=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True, db_index=True)),
                        ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='audit_events', to='tenants.tenant')),
                    ],
                    options={
                        'db_table': 'registry_auditevent',
                        'ordering': ['-created_at', '-id'],
                        'indexes': [models.Index(fields=['tenant', '-created_at'], name='registry_au_tenant__f6afa9_idx')],
                    },
                ),
            ],
        ),
        migrations.AlterModelTable(name='auditevent', table=None),
        migrations.RenameIndex(model_name='auditevent', new_name='audit_tenant_time', old_name='registry_au_tenant__f6afa9_idx'),
        migrations.RunPython(move_content_type, move_content_type_back),
    ]
