"""The OpenAPI schema documents every registry endpoint; the admin shows and acts on the
registry, each action through a service: audited, its work queued once the change commits."""

import pytest

from audit.models import AuditEvent
from registry import queue
from registry.models import AdapterVersion, Alias
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


@pytest.fixture
def sent_tasks(monkeypatch):
    """The Celery tasks sent, as (name, args), instead of reaching a broker."""
    from platform_site.celery import app

    sent = []
    monkeypatch.setattr(app, "send_task", lambda name, args=(), **_: sent.append((name, args)))
    return sent


def run_action(admin_client, model: str, action: str, *objects):
    return admin_client.post(
        f"/admin/registry/{model}/",
        {"action": action, "_selected_action": [o.pk for o in objects]},
        follow=True,
    )


def run_version_action(admin_client, action: str, *versions):
    return run_action(admin_client, "adapterversion", action, *versions)


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


def test_admin_restage_is_audited_and_queues_the_staging_of_ready_versions(
    admin_client,
    adapter,
    good_adapter_dir,
    second_adapter_dir,
    sent_tasks,
    django_capture_on_commit_callbacks,
):
    ready = make_ready_version(adapter, good_adapter_dir)
    rejected = make_ready_version(adapter, second_adapter_dir)
    AdapterVersion.objects.filter(pk=rejected.pk).update(status=AdapterVersion.REJECTED)

    with django_capture_on_commit_callbacks(execute=True):
        response = run_version_action(admin_client, "restage", ready, rejected)

    assert "Queued staging of 1 version(s)." in response.content.decode()
    assert sent_tasks == [(queue.STAGE, [ready.pk])]
    event = AuditEvent.objects.get(verb="version.restage")
    assert (event.tenant, event.actor, event.object_repr) == (
        adapter.tenant,
        "admin:root",
        ready.label,
    )


def test_admin_recheck_is_audited_for_each_version_it_will_check_and_queues_it(
    admin_client,
    adapter,
    base_model,
    good_adapter_dir,
    second_adapter_dir,
    sent_tasks,
    django_capture_on_commit_callbacks,
):
    unchecked = make_ready_version(adapter, good_adapter_dir)
    make_ready_version(adapter, second_adapter_dir)  # checked against this revision already
    AdapterVersion.objects.filter(pk=unchecked.pk).update(checked_revision="0" * 64)

    with django_capture_on_commit_callbacks(execute=True):
        response = run_action(admin_client, "basemodel", "recheck", base_model)

    assert "Queued a compatibility re-check for 1 model(s)." in response.content.decode()
    assert sent_tasks == [(queue.RECHECK, [base_model.pk])]
    event = AuditEvent.objects.get(verb="version.recheck")
    assert (event.tenant, event.actor, event.object_repr) == (
        adapter.tenant,
        "admin:root",
        unchecked.label,
    )
    assert event.before["revision"] == "0" * 64
    assert event.after == {"base_model": base_model.name, "revision": base_model.revision}
