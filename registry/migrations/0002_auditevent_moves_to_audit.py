"""AuditEvent now lives in the audit app (audit/migrations/0001): forget it here, state only.

The table is audit's now, so no SQL runs: dropping it would lose the trail.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('audit', '0001_initial'),
        ('registry', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='AuditEvent')],
        ),
    ]
