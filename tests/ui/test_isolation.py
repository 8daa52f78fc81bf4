"""Every page is scoped to the signed-in user's tenant: charlie (tenant B) gets 404 on tenant
A's objects, exactly as for missing ones, and cannot switch into a tenant he is not in."""

import pytest

from registry.models import Alias
from registry.services.adapters import adapter_create
from tenants.models import ApiKey
from tenants.principal import SESSION_TENANT
from tenants.scopes import MEMBER
from tenants.services import membership_set
from tests.ui.conftest import ALICE_ACTOR, make_version, page

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenant_a_state(adapter, good_adapter_dir, make_key, tenant_b):
    make_version(adapter, good_adapter_dir)
    key, _ = make_key(adapter.tenant, name="a-key")
    return key


A_PAGES = [
    "/adapters/support-bot/",
    "/adapters/support-bot/upload/",
    "/adapters/support-bot/versions/1/status/",
]


@pytest.mark.parametrize("path", A_PAGES)
def test_another_tenants_pages_are_404(signed_in, charlie, tenant_a_state, path):
    response = signed_in(charlie).get(path)
    assert response.status_code == 404
    assert "belongs to another tenant" in page(response)


@pytest.mark.parametrize(
    "path, data",
    [
        ("/adapters/support-bot/aliases/production/", {"version": 1}),
        ("/adapters/support-bot/aliases/production/delete/", {}),
        ("/keys/{key}/revoke/", {}),
    ],
)
def test_another_tenants_objects_cannot_be_changed(signed_in, charlie, tenant_a_state, path, data):
    response = signed_in(charlie).post(path.format(key=tenant_a_state.pk), data)
    assert response.status_code == 404
    assert not Alias.objects.exists()
    assert ApiKey.objects.get(pk=tenant_a_state.pk).revoked_at is None


def test_lists_show_only_the_own_tenants_objects(signed_in, charlie, tenant_a_state):
    client = signed_in(charlie)
    assert "support-bot" not in page(client.get("/adapters/"))
    assert "a-key" not in page(client.get("/keys/"))
    assert "support-bot" not in page(client.get("/playground/"))


def test_switching_to_a_tenant_one_is_not_in_is_404(signed_in, charlie, tenant_a_state):
    client = signed_in(charlie)
    response = client.post("/tenant/", {"tenant": "tenant-a"})
    assert response.status_code == 404
    assert client.session.get(SESSION_TENANT) != "tenant-a"


def test_a_member_of_two_tenants_switches_between_them(signed_in, charlie, tenant_a_state):
    membership_set(tenant=tenant_a_state.tenant, user=charlie, role=MEMBER)
    adapter_create(tenant=charlie.memberships.get(role="owner").tenant, name="b-bot", actor="t")
    client = signed_in(charlie)

    first = page(client.get("/adapters/"))  # the first tenant by slug: tenant-a
    assert "support-bot" in first and "b-bot" not in first
    assert 'value="tenant-b"' in first  # the switcher offers both

    response = client.post("/tenant/", {"tenant": "tenant-b"}, follow=True)
    assert client.session[SESSION_TENANT] == "tenant-b"
    assert "b-bot" in page(response) and "support-bot" not in page(response)
    assert client.get("/adapters/support-bot/").status_code == 404


def test_a_suspended_tenant_shows_why_and_nothing_else(signed_in, alice, tenant_a_state):
    tenant = tenant_a_state.tenant
    tenant.is_active = False
    tenant.save()
    response = signed_in(alice).get("/adapters/support-bot/")
    assert response.status_code == 403
    assert "suspended" in page(response) and "status-ready" not in page(response)


def test_the_upload_api_acts_for_the_tenant_the_session_names(
    signed_in, charlie, tenant_a_state, good_adapter_dir
):
    """The upload page posts to the REST endpoint with the session: same tenant, same 404."""
    from tests.registry.conftest import files_of

    adapter_create(tenant=charlie.memberships.get().tenant, name="b-bot", actor=ALICE_ACTOR)
    client = signed_in(charlie)
    client.get("/adapters/")
    response = client.post("/api/v1/adapters/support-bot/versions/", files_of(good_adapter_dir))
    assert response.status_code == 404
