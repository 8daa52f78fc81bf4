"""/api/v1/audit/: the tenant's trail, including API key creation and revocation."""

import pytest

from audit.models import AuditEvent
from tenants.scopes import INFERENCE

pytestmark = pytest.mark.django_db


def test_key_creation_and_revocation_are_audited_with_the_actor(tenant_a, alice, user_client):
    client = user_client(alice)
    created = client.post(
        "/api/v1/keys/", {"name": "ci", "scopes": [INFERENCE]}, format="json"
    ).json()
    client.delete(f"/api/v1/keys/{created['id']}/")
    client.delete(f"/api/v1/keys/{created['id']}/")  # idempotent: one event
    events = client.get("/api/v1/audit/").json()
    assert [(e["verb"], e["actor"]) for e in events] == [
        ("api_key.revoke", "user:alice@example.com"),
        ("api_key.create", "user:alice@example.com"),
    ]
    assert events[1]["object"] == f"ci (lpx_{created['prefix']})"
    assert events[1]["after"]["scopes"] == [INFERENCE]
    assert events[0]["before"]["revoked_at"] is None and events[0]["after"]["revoked_at"]
    secret = created["key"].split("_", 2)[2]  # lpx_<prefix>_<secret>; the secret may hold "_"
    assert all(secret not in str(e) for e in events)  # never the secret


def test_a_key_acting_is_named_by_its_prefix(tenant_a, make_key, key_client):
    api_key, full = make_key(tenant_a)
    key_client(full).post("/api/v1/keys/", {"name": "child", "scopes": [INFERENCE]}, format="json")
    assert AuditEvent.objects.filter(actor=f"key:{api_key.prefix}").count() == 1


def test_audit_filters_by_verb_and_limits(tenant_a, alice, user_client, make_key):
    for _ in range(3):
        make_key(tenant_a)
    client = user_client(alice)
    assert len(client.get("/api/v1/audit/?limit=2").json()) == 2
    assert len(client.get("/api/v1/audit/?verb=api_key.create").json()) == 3
    assert client.get("/api/v1/audit/?verb=alias.set").json() == []
    bad = client.get("/api/v1/audit/?limit=0")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"


def test_each_tenant_sees_only_its_own_events(tenant_a, tenant_b, charlie, user_client, make_key):
    make_key(tenant_a)
    assert user_client(charlie).get("/api/v1/audit/").json() == []
