"""Moving AuditEvent from registry to audit keeps every event already recorded."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

# Before the move: registry's 0001 owns the table (registry_auditevent), audit has nothing.
BEFORE = [("registry", "0001_initial"), ("tenants", "0002_usage_record")]


def migrate(*, unapply=(), to) -> object:
    """Migrate the test database (unapplying whole apps first); return the models as of `to`."""
    executor = MigrationExecutor(connection)
    executor.migrate([(app, None) for app in unapply] + to)
    return MigrationExecutor(connection).loader.project_state(to).apps


@pytest.mark.django_db(transaction=True)
def test_events_recorded_before_the_move_are_still_there_after_it():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    old = migrate(unapply=["audit"], to=BEFORE)
    tenant = old.get_model("tenants", "Tenant").objects.create(slug="old", name="Old")
    old.get_model("registry", "AuditEvent").objects.create(
        tenant=tenant,
        actor="user:old",
        verb="adapter.create",
        object_type="adapter",
        object_repr="bot",
    )

    new = migrate(to=latest)

    events = new.get_model("audit", "AuditEvent").objects.all()
    assert [(e.actor, e.verb, e.object_repr) for e in events] == [
        ("user:old", "adapter.create", "bot")
    ]
    assert "registry_auditevent" not in connection.introspection.table_names()
