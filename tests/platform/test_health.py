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
def test_readyz_is_503_naming_the_failed_dependency_and_only_that(monkeypatch, caplog):
    """The reason names hosts, users and URLs: it goes to the log, not to whoever asks."""
    secret = "redis://:hunter2@broker.internal:6379/0 refused"

    def broken():
        raise ConnectionError(secret)

    monkeypatch.setitem(health.READINESS_CHECKS, "broker", broken)
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "failed": ["broker"]}
    assert "hunter2" not in response.content.decode()
    assert secret in caplog.text and "broker" in caplog.text


@pytest.mark.django_db
def test_schema_and_docs_render(tenant_a):
    client = Client()
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert {"/api/v1/tenant/", "/api/v1/keys/", "/api/v1/keys/{key_id}/"} <= set(paths)
    docs = client.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger-ui" in docs.content
