"""/api/v1/adapters/ and /api/v1/base-models/: create, list, edit, delete."""

import pytest

from audit.models import AuditEvent
from registry.models import Adapter, AdapterVersion, Alias
from registry.services.aliases import alias_set
from tests.registry.conftest import ALICE_ACTOR, BASE_NAME, make_ready_version, stored_objects

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(tenant_a, alice, user_client):
    return user_client(alice)


def test_base_models_lists_the_served_model_with_its_fingerprint(client, base_model):
    [listed] = client.get("/api/v1/base-models/").json()
    assert listed["name"] == BASE_NAME and listed["is_default"] is True
    assert len(listed["revision"]) == 64
    assert listed["fingerprint"]["num_layers"] == 2 and listed["fingerprint"]["hidden"] == 64
    assert listed["fingerprint"]["modules"]["k_proj"] == [64, 32]
    assert "local_path" not in listed


def test_create_uses_the_served_base_model_and_is_audited(client, base_model):
    response = client.post(
        "/api/v1/adapters/", {"name": "support-bot", "description": "tickets"}, format="json"
    )
    assert response.status_code == 201
    assert response.json() | {"created_at": None, "updated_at": None} == {
        "name": "support-bot",
        "base_model": BASE_NAME,
        "description": "tickets",
        "created_by": "user:alice@example.com",
        "created_at": None,
        "updated_at": None,
    }
    event = AuditEvent.objects.get(verb="adapter.create")
    assert event.actor == "user:alice@example.com" and event.after["name"] == "support-bot"
    assert [a["name"] for a in client.get("/api/v1/adapters/").json()] == ["support-bot"]


def test_create_names_an_unknown_base_model(client, base_model):
    response = client.post("/api/v1/adapters/", {"name": "x", "base_model": "gpt-5"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "base_model"
    assert "no base model named 'gpt-5'" in response.json()["error"]["message"]


def test_create_without_any_served_base_model_says_what_to_do(client, db):
    response = client.post("/api/v1/adapters/", {"name": "x"}, format="json")
    assert response.status_code == 400
    assert "import_base_model" in response.json()["error"]["message"]


def test_a_duplicate_name_is_409(client, adapter):
    response = client.post("/api/v1/adapters/", {"name": "support-bot"}, format="json")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "adapter_exists"


def test_patch_changes_only_the_description(client, adapter):
    response = client.patch(
        "/api/v1/adapters/support-bot/", {"description": "v2 of the bot"}, format="json"
    )
    assert response.status_code == 200 and response.json()["description"] == "v2 of the bot"
    event = AuditEvent.objects.get(verb="adapter.update")
    assert event.before["description"] == "" and event.after["description"] == "v2 of the bot"
    too_long = client.patch(
        "/api/v1/adapters/support-bot/", {"description": "x" * 2001}, format="json"
    )
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "description"


def test_delete_refuses_while_an_alias_points_at_it(client, adapter, good_adapter_dir):
    version = make_ready_version(adapter, good_adapter_dir)
    alias_set(adapter=adapter, name="production", version_number=version.number, actor=ALICE_ACTOR)
    response = client.delete("/api/v1/adapters/support-bot/")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "adapter_in_use"
    assert "production -> v1" in response.json()["error"]["message"]
    assert Adapter.objects.count() == 1 and len(stored_objects()) == 2


def test_forced_delete_removes_rows_objects_and_staged_copies(
    client, adapter, good_adapter_dir, django_capture_on_commit_callbacks, settings
):
    from registry.staging import ensure_staged

    version = make_ready_version(adapter, good_adapter_dir)
    alias_set(adapter=adapter, name="production", version_number=version.number, actor=ALICE_ACTOR)
    folder = ensure_staged(version)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.delete("/api/v1/adapters/support-bot/?force=true")
    assert response.status_code == 204
    assert Adapter.objects.count() == AdapterVersion.objects.count() == Alias.objects.count() == 0
    assert stored_objects() == []
    assert not folder.exists()
    event = AuditEvent.objects.get(verb="adapter.delete")
    assert event.before["versions"] == [1] and event.before["aliases"] == {"production": 1}
    assert client.get("/api/v1/adapters/support-bot/").status_code == 404


def test_delete_without_aliases_needs_no_force(
    client, adapter, good_adapter_dir, django_capture_on_commit_callbacks
):
    make_ready_version(adapter, good_adapter_dir)
    with django_capture_on_commit_callbacks(execute=True):
        assert client.delete("/api/v1/adapters/support-bot/").status_code == 204
    assert stored_objects() == []
