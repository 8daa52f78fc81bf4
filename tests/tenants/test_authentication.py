"""Every bad credential gets its own status and error code, in the OpenAI error shape."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from tenants.models import ApiKey
from tenants.services import api_key_touch, tenant_set_active

pytestmark = pytest.mark.django_db


def get_tenant(header=None):
    client = APIClient()
    if header is not None:
        client.credentials(HTTP_AUTHORIZATION=header)
    return client.get("/api/v1/tenant/")


def assert_error(response, status, code):
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code
    assert error["message"] and error["type"]


def test_missing_header_is_401_with_a_bearer_challenge(tenant_a):
    response = get_tenant()
    assert_error(response, 401, "missing_api_key")
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("header", ["lpx_abc", "Basic dXNlcjpwYXNz", "Bearer", "Bearer    "])
def test_malformed_header_is_401(header, tenant_a):
    assert_error(get_tenant(header), 401, "malformed_authorization")


@pytest.mark.parametrize(
    "token", ["not-a-key", "lpx_zzzzzzzzzzzz_" + "a" * 43, "lpx_" + "0" * 12 + "_short"]
)
def test_malformed_or_unknown_key_is_401(token, tenant_a):
    assert_error(get_tenant(f"Bearer {token}"), 401, "invalid_api_key")


def test_right_prefix_wrong_secret_is_401(tenant_a, make_key):
    api_key, full = make_key(tenant_a)
    forged = f"lpx_{api_key.prefix}_" + ("A" * 43)
    assert forged != full
    assert_error(get_tenant(f"Bearer {forged}"), 401, "invalid_api_key")


def test_expired_key_is_401(tenant_a, make_key):
    api_key, full = make_key(tenant_a)
    ApiKey.objects.filter(pk=api_key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert_error(get_tenant(f"Bearer {full}"), 401, "expired_api_key")


def test_revoked_key_is_401(tenant_a, make_key):
    api_key, full = make_key(tenant_a)
    ApiKey.objects.filter(pk=api_key.pk).update(revoked_at=timezone.now())
    assert_error(get_tenant(f"Bearer {full}"), 401, "revoked_api_key")


def test_suspended_tenant_is_403_for_keys_and_members(tenant_a, alice, make_key, user_client):
    _, full = make_key(tenant_a)
    tenant_set_active(tenant=tenant_a, active=False)
    assert_error(get_tenant(f"Bearer {full}"), 403, "tenant_suspended")
    assert_error(user_client(alice).get("/api/v1/tenant/"), 403, "tenant_suspended")


def test_signed_in_user_without_membership_is_403(tenant_a, charlie, user_client):
    assert_error(user_client(charlie).get("/api/v1/tenant/"), 403, "no_tenant")


def test_key_use_is_recorded_at_most_once_a_minute(tenant_a, make_key):
    api_key, full = make_key(tenant_a)
    assert get_tenant(f"Bearer {full}").status_code == 200
    first = ApiKey.objects.get(pk=api_key.pk).last_used_at
    assert first is not None
    assert get_tenant(f"Bearer {full}").status_code == 200
    assert ApiKey.objects.get(pk=api_key.pk).last_used_at == first
    api_key.refresh_from_db()
    api_key_touch(api_key=api_key, now=first + timedelta(minutes=1, seconds=1))
    assert ApiKey.objects.get(pk=api_key.pk).last_used_at > first


def test_a_refused_key_is_a_401_for_a_browser_too(tenant_a):
    response = APIClient().get(
        "/api/v1/tenant/", HTTP_AUTHORIZATION="Bearer lpx_nope", HTTP_ACCEPT="text/html"
    )
    assert response.status_code == 401 and b"invalid_api_key" in response.content
