"""The isolation matrix: every registry endpoint and verb, for charlie (another tenant, by
session and by key), bob (a member: read-only), narrow keys and no credentials."""

import pytest

from audit.models import AuditEvent
from registry.models import Adapter, AdapterVersion, Alias
from registry.services.aliases import alias_set
from tenants.scopes import INFERENCE, REGISTRY_READ
from tests.registry.conftest import ALICE_ACTOR, files_of, make_ready_version, stored_objects

pytestmark = pytest.mark.django_db

A = "/api/v1/adapters/support-bot"
MISSING = "/api/v1/adapters/no-such-adapter"


def tenant_a_endpoints(folder, prefix=A):
    """(method, path, body, format) for every per-adapter endpoint and verb."""
    return [
        ("get", f"{prefix}/", None, None),
        ("patch", f"{prefix}/", {"description": "pwned"}, "json"),
        ("delete", f"{prefix}/", None, None),
        ("delete", f"{prefix}/?force=true", None, None),
        ("get", f"{prefix}/versions/", None, None),
        ("post", f"{prefix}/versions/", lambda: files_of(folder), "multipart"),
        ("post", f"{prefix}/versions/", {"source": "s3://anything/x/"}, "json"),
        ("get", f"{prefix}/versions/1/", None, None),
        ("get", f"{prefix}/aliases/", None, None),
        ("get", f"{prefix}/aliases/production/", None, None),
        ("put", f"{prefix}/aliases/production/", {"version": 1}, "json"),
        ("put", f"{prefix}/aliases/canary/", {"version": 1, "weight": 50}, "json"),
        ("delete", f"{prefix}/aliases/production/", None, None),
    ]


def send(client, method, path, body, fmt):
    body = body() if callable(body) else body
    kwargs = {"format": fmt} if fmt else {}
    return (
        getattr(client, method)(path, body, **kwargs)
        if body is not None
        else getattr(client, method)(path)
    )


@pytest.fixture
def tenant_a_state(adapter, good_adapter_dir):
    version = make_ready_version(adapter, good_adapter_dir)
    alias_set(adapter=adapter, name="production", version_number=version.number, actor=ALICE_ACTOR)
    return adapter


def snapshot(tenant):
    return (
        list(Adapter.objects.filter(tenant=tenant).values()),
        list(AdapterVersion.objects.filter(adapter__tenant=tenant).values()),
        list(Alias.objects.filter(adapter__tenant=tenant).values()),
        AuditEvent.objects.filter(tenant=tenant).count(),
        stored_objects(),
    )


def test_charlie_gets_404_everywhere_and_changes_nothing(
    tenant_a_state, tenant_b, charlie, make_key, user_client, key_client, good_adapter_dir
):
    before = snapshot(tenant_a_state.tenant)
    _, charlie_key = make_key(tenant_b)
    for client in (user_client(charlie), key_client(charlie_key)):
        for method, path, body, fmt in tenant_a_endpoints(good_adapter_dir):
            response = send(client, method, path, body, fmt)
            assert response.status_code == 404, (method, path, response.status_code)
            assert response.json()["error"]["code"] == "not_found", (method, path)
        assert client.get("/api/v1/adapters/").json() == []
        assert all(e["object"] != "support-bot" for e in client.get("/api/v1/audit/").json())
    assert snapshot(tenant_a_state.tenant) == before


def test_a_foreign_adapter_answers_exactly_like_a_missing_one(
    tenant_a_state, tenant_b, charlie, user_client, good_adapter_dir
):
    client = user_client(charlie)
    foreign = tenant_a_endpoints(good_adapter_dir)
    missing = tenant_a_endpoints(good_adapter_dir, prefix=MISSING)
    for (method, path, body, fmt), (_, missing_path, _, _) in zip(foreign, missing, strict=True):
        a = send(client, method, path, body, fmt)
        b = send(client, method, missing_path, body, fmt)
        assert (a.status_code, a.json()) == (b.status_code, b.json()), (method, path)


def test_charlie_may_use_the_same_name_in_his_own_tenant(
    tenant_a_state, tenant_b, charlie, user_client
):
    response = user_client(charlie).post(
        "/api/v1/adapters/", {"name": "support-bot"}, format="json"
    )
    assert response.status_code == 201
    assert Adapter.objects.filter(name="support-bot").count() == 2
    assert user_client(charlie).get(f"{A}/versions/").json() == []


def test_bob_reads_but_cannot_write(tenant_a_state, bob, user_client, good_adapter_dir):
    client = user_client(bob)
    before = snapshot(tenant_a_state.tenant)
    for method, path, body, fmt in tenant_a_endpoints(good_adapter_dir):
        response = send(client, method, path, body, fmt)
        if method == "get":
            assert response.status_code == 200, (method, path)
        else:
            assert response.status_code == 403, (method, path, response.status_code)
            assert response.json()["error"]["code"] == "insufficient_scope"
    created = client.post("/api/v1/adapters/", {"name": "bobs"}, format="json")
    assert created.status_code == 403
    assert client.get("/api/v1/audit/").status_code == 200
    assert client.get("/api/v1/base-models/").status_code == 200
    assert snapshot(tenant_a_state.tenant) == before


def test_key_scopes_decide_reads_and_writes(tenant_a_state, make_key, key_client, good_adapter_dir):
    _, read_only = make_key(tenant_a_state.tenant, scopes=[REGISTRY_READ])
    _, inference_only = make_key(tenant_a_state.tenant, scopes=[INFERENCE])
    before = snapshot(tenant_a_state.tenant)
    for method, path, body, fmt in tenant_a_endpoints(good_adapter_dir):
        response = send(key_client(read_only), method, path, body, fmt)
        assert response.status_code == (200 if method == "get" else 403), (method, path)
        response = send(key_client(inference_only), method, path, body, fmt)
        assert response.status_code == 403, (method, path)
        assert "registry:" in response.json()["error"]["message"]
    assert snapshot(tenant_a_state.tenant) == before


def test_no_credentials_is_401_everywhere(tenant_a_state, good_adapter_dir):
    from rest_framework.test import APIClient

    client = APIClient()
    paths = [*tenant_a_endpoints(good_adapter_dir), ("get", "/api/v1/audit/", None, None)]
    for method, path, body, fmt in paths + [("get", "/api/v1/base-models/", None, None)]:
        response = send(client, method, path, body, fmt)
        assert response.status_code == 401, (method, path)
        assert response.json()["error"]["code"] == "missing_api_key"
