"""/api/v1/keys/: create, list, revoke; the isolation matrix for alice, bob and charlie."""

import pytest

from tenants.models import ApiKey
from tenants.scopes import ADMIN, INFERENCE, KEYS_WRITE, REGISTRY_READ, REGISTRY_WRITE
from tenants.services import membership_set

pytestmark = pytest.mark.django_db


def create(client, **body):
    return client.post(
        "/api/v1/keys/", {"name": "ci", "scopes": [INFERENCE], **body}, format="json"
    )


def test_owner_creates_a_key_and_sees_it_once(tenant_a, alice, user_client, key_client):
    client = user_client(alice)
    response = create(client)
    assert response.status_code == 201
    full = response.json()["key"]
    assert full.startswith("lpx_") and response.json()["scopes"] == [INFERENCE]
    # The key works, and no later read ever returns it again.
    assert key_client(full).get("/api/v1/tenant/").json()["slug"] == "tenant-a"
    listed = client.get("/api/v1/keys/").json()
    assert [k["prefix"] for k in listed] == [response.json()["prefix"]]
    assert all("key" not in k and "hashed_key" not in k for k in listed)
    detail = client.get(f"/api/v1/keys/{response.json()['id']}/").json()
    assert "key" not in detail


def test_a_key_with_keys_write_can_create_keys_with_its_scopes(tenant_a, make_key, key_client):
    _, full = make_key(tenant_a, scopes=[KEYS_WRITE, INFERENCE])
    response = create(key_client(full), name="child")
    assert response.status_code == 201
    assert ApiKey.objects.get(pk=response.json()["id"]).tenant == tenant_a


@pytest.mark.parametrize(
    "held, asked, lacking",
    [
        ([KEYS_WRITE], [INFERENCE], "inference"),
        ([KEYS_WRITE, REGISTRY_READ], [REGISTRY_READ, REGISTRY_WRITE], "registry:write"),
        ([KEYS_WRITE, INFERENCE], [INFERENCE, REGISTRY_READ, REGISTRY_WRITE], "registry:read"),
    ],
)
def test_a_key_cannot_mint_a_key_with_scopes_it_lacks(
    tenant_a, make_key, key_client, held, asked, lacking
):
    parent, full = make_key(tenant_a, scopes=held)
    response = create(key_client(full), name="stronger", scopes=asked)
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "scope_not_held" and error["param"] == "scopes"
    assert lacking in error["message"]
    assert list(ApiKey.objects.all()) == [parent]


def test_a_member_grants_no_more_than_their_role(tenant_a, bob, user_client, monkeypatch):
    """Roles with keys:write hold every scope today; a narrower one must still be bounded."""
    from tenants import scopes

    membership_set(tenant=tenant_a, user=bob, role=ADMIN)
    narrower = {**scopes.SCOPES_BY_ROLE, ADMIN: frozenset({KEYS_WRITE, INFERENCE})}
    monkeypatch.setattr("tenants.principal.SCOPES_BY_ROLE", narrower)
    client = user_client(bob)
    assert create(client, scopes=[INFERENCE]).status_code == 201
    response = create(client, scopes=[INFERENCE, REGISTRY_WRITE])
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "scope_not_held"
    assert ApiKey.objects.count() == 1


def test_stored_row_never_contains_the_secret(tenant_a, alice, user_client):
    full = create(user_client(alice)).json()["key"]
    secret = full.split("_", 2)[2]
    row = ApiKey.objects.get()
    stored = " ".join(str(getattr(row, f.attname)) for f in ApiKey._meta.fields)
    assert secret not in stored and full not in stored
    assert len(row.hashed_key) == 64


def test_member_without_admin_role_cannot_create_or_list_keys(tenant_a, bob, user_client):
    client = user_client(bob)
    response = create(client)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "insufficient_scope"
    assert client.get("/api/v1/keys/").status_code == 403
    assert ApiKey.objects.count() == 0


def test_key_without_keys_write_scope_is_refused(tenant_a, make_key, key_client):
    _, full = make_key(tenant_a, scopes=[INFERENCE])
    response = create(key_client(full))
    assert response.status_code == 403
    assert response.json()["error"] == {
        "message": "This API key lacks the 'keys:write' scope.",
        "type": "permission_error",
        "param": None,
        "code": "insufficient_scope",
    }


@pytest.mark.parametrize("method", ["get", "delete"])
def test_charlie_cannot_see_or_revoke_tenant_a_keys(
    method, tenant_a, tenant_b, charlie, make_key, user_client, key_client
):
    a_key, _ = make_key(tenant_a)
    _, charlie_key = make_key(tenant_b)
    for client in (user_client(charlie), key_client(charlie_key)):
        response = getattr(client, method)(f"/api/v1/keys/{a_key.pk}/")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
        assert all(k["id"] != a_key.pk for k in client.get("/api/v1/keys/").json())
    a_key.refresh_from_db()
    assert a_key.revoked_at is None


def test_missing_key_and_foreign_key_give_the_same_404(
    tenant_a, tenant_b, charlie, make_key, user_client
):
    a_key, _ = make_key(tenant_a)
    client = user_client(charlie)
    foreign = client.get(f"/api/v1/keys/{a_key.pk}/")
    missing = client.get("/api/v1/keys/999999/")
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json() == missing.json()


def test_revoked_key_stops_working_at_once(tenant_a, alice, make_key, user_client, key_client):
    api_key, full = make_key(tenant_a)
    assert key_client(full).get("/api/v1/tenant/").status_code == 200
    assert user_client(alice).delete(f"/api/v1/keys/{api_key.pk}/").json()["revoked_at"]
    response = key_client(full).get("/api/v1/tenant/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "revoked_api_key"


def test_revoking_twice_keeps_the_first_time(tenant_a, alice, make_key, user_client):
    api_key, _ = make_key(tenant_a)
    client = user_client(alice)
    first = client.delete(f"/api/v1/keys/{api_key.pk}/").json()["revoked_at"]
    assert client.delete(f"/api/v1/keys/{api_key.pk}/").json()["revoked_at"] == first


@pytest.mark.parametrize(
    "body, param",
    [
        ({"scopes": ["root"]}, "scopes[0]"),
        ({"scopes": []}, "scopes"),
        ({"name": ""}, "name"),
        ({"expires_in_days": 0}, "expires_in_days"),
        ({"name": "x" * 101}, "name"),
        ({"expires_in_days": 3651}, "expires_in_days"),
        ({"expires_in_days": 2**64}, "expires_in_days"),
        ({"expires_in_days": -1}, "expires_in_days"),
        ({"expires_in_days": 1.5}, "expires_in_days"),
    ],
)
def test_bad_key_requests_are_400_naming_the_field(body, param, tenant_a, alice, user_client):
    response = create(user_client(alice), **body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert ApiKey.objects.count() == 0


@pytest.mark.parametrize(
    "raw",
    [
        '{"name": "x", "scopes": ["inference"], "expires_in_days": 1e309}',
        '{"name": "x", "scopes": ["inference"], "expires_in_days": NaN}',
        '{"name": "x", "scopes": ["inference"], "expires_in_days": 1' + "0" * 5000 + "}",
        "[" * 100_000,  # nested past Python's recursion limit: was a 500
    ],
)
def test_bodies_with_unparseable_numbers_or_nesting_are_400(raw, tenant_a, alice, user_client):
    response = user_client(alice).post("/api/v1/keys/", raw, content_type="application/json")
    assert response.status_code == 400, response.content[:300]
    assert response.json()["error"]["code"] in {"parse_error", "invalid_request"}
    assert ApiKey.objects.count() == 0


def test_expiring_key_records_its_expiry(tenant_a, alice, user_client):
    response = create(user_client(alice), expires_in_days=7)
    assert response.status_code == 201
    assert response.json()["expires_at"] is not None


def test_user_in_two_tenants_chooses_with_the_header(tenant_a, tenant_b, alice, user_client):
    from tenants.scopes import ADMIN
    from tenants.services import membership_set

    membership_set(tenant=tenant_b, user=alice, role=ADMIN)
    client = user_client(alice)
    assert client.get("/api/v1/tenant/").json()["slug"] == "tenant-a"
    assert (
        client.get("/api/v1/tenant/", HTTP_X_LORAPLEX_TENANT="tenant-b").json()["slug"]
        == "tenant-b"
    )
    other = client.get("/api/v1/tenant/", HTTP_X_LORAPLEX_TENANT="no-such")
    assert other.status_code == 403 and other.json()["error"]["code"] == "no_tenant"
