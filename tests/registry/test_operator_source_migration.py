"""Versions an operator registered before `operator_source` existed held the host path in
`source`, which the tenant reads: the migration moves it, and scrubs the audit trail."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = ("registry", "0007_quantized_bases")  # every other app as it is now
PATH = "/srv/operator/loras/support-v3"


def migrate(to) -> object:
    executor = MigrationExecutor(connection)
    executor.migrate(to)
    return MigrationExecutor(connection).loader.project_state(to).apps


def make_version(apps, adapter, number: int, *, source: str, actor: str):
    return apps.get_model("registry", "AdapterVersion").objects.create(
        adapter=adapter,
        number=number,
        source=source,
        created_by=actor,
        config_size=1,
        weights_size=1,
    )


def record(apps, tenant, *, actor: str, label: str, source: str):
    return apps.get_model("audit", "AuditEvent").objects.create(
        tenant=tenant,
        actor=actor,
        verb="version.upload",
        object_type="adapter_version",
        object_repr=label,
        after={"number": 1, "status": "pending", "source": source},
    )


@pytest.mark.django_db(transaction=True)
def test_an_operator_path_moves_out_of_what_the_tenant_reads():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    old = migrate([node for node in latest if node[0] != "registry"] + [BEFORE])
    tenant = old.get_model("tenants", "Tenant").objects.create(slug="old", name="Old")
    base = old.get_model("registry", "BaseModel").objects.create(
        name="old-base", fingerprint={}, local_path="/base"
    )
    adapter = old.get_model("registry", "Adapter").objects.create(
        tenant=tenant, name="bot", base_model=base, created_by="user:old"
    )
    make_version(old, adapter, 1, source=PATH, actor="operator")
    make_version(old, adapter, 2, source="upload", actor="user:old")
    make_version(old, adapter, 3, source="s3://tenant-bucket/runs/", actor="key:abc")
    record(old, tenant, actor="operator", label="bot/v1", source=PATH)
    record(old, tenant, actor="system:validator", label="bot/v1", source=PATH)
    record(old, tenant, actor="operator", label="bot/v2", source="/srv/operator/other")
    record(old, tenant, actor="key:abc", label="bot/v3", source="s3://tenant-bucket/runs/")

    new = migrate(latest)

    versions = new.get_model("registry", "AdapterVersion").objects.order_by("number")
    assert [(v.source, v.operator_source) for v in versions] == [
        ("operator", PATH),
        ("upload", ""),
        ("s3://tenant-bucket/runs/", ""),  # the tenant's own prefix: theirs to see
    ]
    events = new.get_model("audit", "AuditEvent").objects.order_by("id")
    assert [e.after["source"] for e in events] == [
        "operator",
        "operator",
        "operator",  # the operator's duplicate of an uploaded version
        "s3://tenant-bucket/runs/",
    ]
    new.get_model("tenants", "Tenant").objects.filter(slug="old").delete()
    new.get_model("registry", "BaseModel").objects.filter(name="old-base").delete()
