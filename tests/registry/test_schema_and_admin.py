"""The OpenAPI schema documents every registry endpoint; the admin shows and acts on the registry."""

import pytest

from registry.models import Alias
from tests.registry.conftest import make_ready_version

pytestmark = pytest.mark.django_db


def test_the_schema_documents_every_registry_path(client):
    schema = client.get("/api/schema/?format=json").json()
    paths = schema["paths"]
    for path, methods in {
        "/api/v1/base-models/": {"get"},
        "/api/v1/adapters/": {"get", "post"},
        "/api/v1/adapters/{name}/": {"get", "patch", "delete"},
        "/api/v1/adapters/{name}/versions/": {"get", "post"},
        "/api/v1/adapters/{name}/versions/{number}/": {"get"},
        "/api/v1/adapters/{name}/aliases/": {"get"},
        "/api/v1/adapters/{name}/aliases/{alias}/": {"get", "put", "delete"},
        "/api/v1/audit/": {"get"},
    }.items():
        assert methods <= set(paths[path]), path
    upload = paths["/api/v1/adapters/{name}/versions/"]["post"]["requestBody"]["content"]
    assert {"multipart/form-data", "application/json"} <= set(upload)


@pytest.fixture
def admin_client(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(admin)
    return client


def test_admin_pages_render_with_a_readable_report(admin_client, adapter, good_adapter_dir):
    version = make_ready_version(adapter, good_adapter_dir)
    for url in (
        "/admin/registry/basemodel/",
        "/admin/registry/adapter/",
        "/admin/registry/adapterversion/?status__exact=ready",
        "/admin/registry/alias/",
        "/admin/audit/auditevent/",
        f"/admin/registry/adapter/{adapter.pk}/change/",
        "/admin/registry/adapterversion/?q=support",
    ):
        assert admin_client.get(url).status_code == 200, url
    page = admin_client.get(f"/admin/registry/adapterversion/{version.pk}/change/").content.decode()
    assert "<table>" in page and "shapes" in page and "rank 4" in page


def run_version_action(admin_client, action: str, version):
    return admin_client.post(
        "/admin/registry/adapterversion/",
        {"action": action, "_selected_action": [version.pk]},
        follow=True,
    )


def test_admin_moves_the_production_alias(admin_client, adapter, good_adapter_dir):
    version = make_ready_version(adapter, good_adapter_dir)
    response = run_version_action(admin_client, "promote", version)
    assert response.status_code == 200
    alias = Alias.objects.get()
    assert alias.name == "production" and alias.version == version
    assert alias.updated_by == "admin:root"


def test_admin_revalidate_refuses_ready_versions(admin_client, adapter, good_adapter_dir):
    version = make_ready_version(adapter, good_adapter_dir)
    response = run_version_action(admin_client, "revalidate", version)
    assert "is ready; a ready version is immutable" in response.content.decode()
    version.refresh_from_db()
    assert version.status == "ready"
