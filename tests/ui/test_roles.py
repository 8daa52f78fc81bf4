"""Members read and use the playground; only admins and owners upload, promote and manage keys.

Bob is a member of tenant A: he sees none of those buttons, and the POSTs behind them are
refused (403) without changing anything.
"""

import pytest

from audit.models import AuditEvent
from registry.models import Adapter, Alias
from tenants.models import ApiKey
from tenants.scopes import ADMIN
from tenants.services import membership_set
from tests.registry.conftest import files_of
from tests.ui.conftest import make_version, page

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenant_a_state(adapter, good_adapter_dir, make_key):
    make_version(adapter, good_adapter_dir)
    key, _ = make_key(adapter.tenant, name="ci")
    return key


def snapshot():
    return (
        list(Adapter.objects.values()),
        list(Alias.objects.values()),
        list(ApiKey.objects.values()),
        AuditEvent.objects.count(),
    )


def test_a_member_sees_no_upload_promote_or_key_buttons(signed_in, bob, tenant_a_state):
    client = signed_in(bob)
    adapters = page(client.get("/adapters/"))
    detail = page(client.get("/adapters/support-bot/"))
    keys = page(client.get("/keys/"))

    assert "New adapter" not in adapters
    assert "Upload a new version" not in detail and "Promote to production" not in detail
    assert "Canary</button>" not in detail and "Remove</button>" not in detail
    assert "Create key" not in keys and "Revoke" not in keys
    assert f"lpx_{tenant_a_state.prefix}" not in keys  # listing keys needs keys:write
    assert "cannot create, list or revoke API keys" in keys
    # ... but reads what there is, and may use the playground.
    assert "status-ready" in detail and "Try in the playground" in detail
    assert client.get("/playground/").status_code == 200
    assert client.get("/usage/").status_code == 200


def test_the_owner_sees_those_buttons(signed_in, alice, tenant_a_state):
    client = signed_in(alice)
    assert "New adapter" in page(client.get("/adapters/"))
    detail = page(client.get("/adapters/support-bot/"))
    assert "Upload a new version" in detail and "Promote to production" in detail
    keys = page(client.get("/keys/"))
    assert "Create key" in keys and "Revoke" in keys


def test_an_admin_may_do_what_an_owner_does(signed_in, bob, tenant_a_state):
    membership_set(tenant=tenant_a_state.tenant, user=bob, role=ADMIN)
    response = signed_in(bob).post("/adapters/support-bot/aliases/production/", {"version": 1})
    assert response.status_code == 302
    assert Alias.objects.get().updated_by == "user:bob@example.com"


@pytest.mark.parametrize(
    "method, path, data",
    [
        ("post", "/adapters/", {"name": "sneaky"}),
        ("get", "/adapters/support-bot/upload/", None),
        ("post", "/adapters/support-bot/aliases/production/", {"version": 1}),
        ("post", "/adapters/support-bot/aliases/canary/", {"version": 1, "weight": 50}),
        ("post", "/keys/", {"name": "mine", "scopes": ["inference"]}),
        ("post", "/keys/{key}/revoke/", {}),
    ],
)
def test_a_members_writes_are_refused_and_change_nothing(
    signed_in, bob, tenant_a_state, method, path, data
):
    before = snapshot()
    client = signed_in(bob)
    path = path.format(key=tenant_a_state.pk)
    response = client.post(path, data) if method == "post" else client.get(path)
    assert response.status_code == 403
    assert "does not allow" in page(response)
    assert snapshot() == before


def test_a_members_alias_removal_is_refused(signed_in, alice, bob, tenant_a_state):
    signed_in(alice).post("/adapters/support-bot/aliases/production/", {"version": 1})
    before = snapshot()
    response = signed_in(bob).post("/adapters/support-bot/aliases/production/delete/")
    assert response.status_code == 403
    assert snapshot() == before


def test_a_members_upload_through_the_api_the_page_uses_is_refused(
    signed_in, bob, tenant_a_state, good_adapter_dir
):
    client = signed_in(bob)
    client.get("/adapters/")  # the session now names tenant A, as in the browser
    response = client.post(
        "/api/v1/adapters/support-bot/versions/",
        files_of(good_adapter_dir),
        headers={"X-Loraplex-Tenant": "tenant-a"},
    )
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "insufficient_scope"


def test_the_keys_page_grants_no_scope_beyond_the_role(signed_in, bob, tenant_a, monkeypatch):
    """Roles with keys:write hold every scope today; a narrower one must still be bounded."""
    from tenants import scopes

    membership_set(tenant=tenant_a, user=bob, role=ADMIN)
    narrower = {**scopes.SCOPES_BY_ROLE, ADMIN: frozenset({scopes.KEYS_WRITE, scopes.INFERENCE})}
    monkeypatch.setattr("tenants.principal.SCOPES_BY_ROLE", narrower)
    client = signed_in(bob)
    refused = client.post("/keys/", {"name": "stronger", "scopes": ["inference", "registry:write"]})
    assert refused.status_code == 403
    assert "You can grant only scopes you hold; you lack registry:write." in page(refused)
    assert not ApiKey.objects.exists()
    created = client.post("/keys/", {"name": "same", "scopes": ["inference"]})
    assert created.status_code == 201
    assert ApiKey.objects.get().scopes == ["inference"]
