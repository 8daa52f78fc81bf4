import pytest
from django.test import Client

from platform_site import health


def test_healthz_needs_nothing():
    response = Client().get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_checks_database_and_broker():
    response = Client().get("/readyz")
    assert response.status_code == 200, response.content
    assert {"database", "broker"} <= set(response.json()["checks"])


@pytest.mark.django_db
def test_readyz_is_503_naming_the_failed_dependency(monkeypatch):
    def broken():
        raise ConnectionError("broker down")

    monkeypatch.setitem(health.READINESS_CHECKS, "broker", broken)
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["failed"] == {"broker": "ConnectionError: broker down"}


@pytest.mark.django_db
def test_schema_and_docs_render(tenant_a):
    client = Client()
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert {"/api/v1/tenant/", "/api/v1/keys/", "/api/v1/keys/{key_id}/"} <= set(paths)
    docs = client.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger-ui" in docs.content
