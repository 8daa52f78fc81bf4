"""API keys from the page: the full key appears once, works, and revoking it stops it."""

import re

import pytest

from tenants.keys import key_matches
from tenants.models import ApiKey
from tests.ui.conftest import page

pytestmark = pytest.mark.django_db


def create(client, **data):
    body = {"name": "ci", "scopes": ["inference", "registry:read"]} | data
    return client.post("/keys/", body)


def test_a_new_key_is_shown_once_and_only_its_hash_is_kept(signed_in, alice, tenant_a):
    client = signed_in(alice)
    response = create(client)
    assert response.status_code == 201
    assert response["Cache-Control"] == "no-store"
    full = re.search(r'id="new-key-value" value="(lpx_[^"]+)"', page(response))[1]

    key = ApiKey.objects.get(name="ci")
    assert key_matches(full, key.hashed_key) and key.scopes == ["inference", "registry:read"]
    assert key.created_by == alice
    listing = page(client.get("/keys/"))
    assert f"lpx_{key.prefix}_" in listing and full not in listing


def test_the_new_key_calls_the_api(signed_in, alice, tenant_a, client):
    full = re.search(r'value="(lpx_[^"]+)"', page(create(signed_in(alice))))[1]
    response = client.get("/api/v1/tenant/", headers={"Authorization": f"Bearer {full}"})
    assert response.status_code == 200 and response.json()["slug"] == "tenant-a"


def test_a_key_with_an_expiry_expires(signed_in, alice, tenant_a):
    create(signed_in(alice), expires_in_days=7)
    key = ApiKey.objects.get()
    assert 6 < (key.expires_at - key.created_at).total_seconds() / 86400 <= 7


@pytest.mark.parametrize(
    "data, message",
    [
        ({"scopes": []}, "This field is required."),
        ({"scopes": ["admin:everything"]}, "is not one of the available choices"),
        ({"name": ""}, "This field is required."),
        ({"expires_in_days": 0}, "greater than or equal to 1"),
    ],
)
def test_a_bad_key_form_says_what_is_wrong_and_creates_nothing(
    signed_in, alice, tenant_a, data, message
):
    response = create(signed_in(alice), **data)
    assert response.status_code == 400
    assert message in page(response)
    assert not ApiKey.objects.exists()


def test_revoking_stops_the_key_at_once(signed_in, alice, tenant_a, client):
    owner = signed_in(alice)
    full = re.search(r'value="(lpx_[^"]+)"', page(create(owner)))[1]
    key = ApiKey.objects.get()

    response = owner.post(f"/keys/{key.pk}/revoke/", follow=True)
    assert "Revoked key" in page(response) and 'status-rejected">revoked' in page(response)
    key.refresh_from_db()
    assert key.revoked_at is not None
    answer = client.get("/api/v1/tenant/", headers={"Authorization": f"Bearer {full}"})
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "revoked_api_key"
