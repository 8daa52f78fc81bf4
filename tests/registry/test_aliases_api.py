"""/api/v1/adapters/{name}/aliases/: rollout, canary, rollback; only ready, compatible versions."""

import pytest

from audit.models import AuditEvent
from registry.models import AdapterVersion, Alias
from tests.registry.conftest import make_ready_version, upload

pytestmark = pytest.mark.django_db
ALIASES = "/api/v1/adapters/support-bot/aliases"


@pytest.fixture
def client(tenant_a, alice, user_client):
    return user_client(alice)


@pytest.fixture
def two_ready(adapter, good_adapter_dir, second_adapter_dir):
    return make_ready_version(adapter, good_adapter_dir), make_ready_version(
        adapter, second_adapter_dir
    )


def put(client, alias, **body):
    return client.put(f"{ALIASES}/{alias}/", body, format="json")


def test_promote_then_roll_back_leaves_an_audit_trail(client, two_ready):
    assert put(client, "production", version=1).status_code == 201
    moved = put(client, "production", version=2)
    assert moved.status_code == 200 and moved.json()["version"] == 2
    back = put(client, "production", version=1)
    assert back.json()["version"] == 1 and back.json()["updated_by"] == "user:alice@example.com"
    events = AuditEvent.objects.filter(verb="alias.set").order_by("id")
    assert [(e.before and e.before["version"], e.after["version"]) for e in events] == [
        (None, 1),
        (1, 2),
        (2, 1),
    ]
    assert client.get(f"{ALIASES}/production/").json()["version"] == 1


def test_canary_carries_a_weight_and_other_aliases_refuse_one(client, two_ready):
    canary = put(client, "canary", version=2, weight=10)
    assert canary.status_code == 201 and canary.json()["weight"] == 10
    assert put(client, "canary", version=2).json()["weight"] == 10  # kept when not sent
    refused = put(client, "production", version=1, weight=10)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "weight"
    too_much = put(client, "canary", version=2, weight=101)
    assert too_much.status_code == 400 and too_much.json()["error"]["param"] == "weight"
    assert put(client, "staging-eu", version=1).status_code == 201  # any slug is an alias
    listed = client.get(f"{ALIASES}/").json()
    assert [(a["name"], a["version"], a["weight"]) for a in listed] == [
        ("canary", 2, 10),
        ("staging-eu", 1, None),
    ]


def test_a_canary_on_the_version_production_serves_is_refused(client, two_ready):
    assert put(client, "production", version=1).status_code == 201
    refused = put(client, "canary", version=1, weight=10)
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "canary_is_production" and error["param"] == "version"
    assert error["message"].startswith("v1 is the version support-bot@production already serves")
    assert not Alias.objects.filter(name="canary").exists()
    assert put(client, "canary", version=2, weight=10).status_code == 201  # another one is fine


def test_only_ready_versions_can_be_pointed_at(client, adapter, good_adapter_dir):
    upload(client, "support-bot", good_adapter_dir)  # pending: nobody validated it
    response = put(client, "production", version=1)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "version_not_ready"
    assert "v1 is pending" in response.json()["error"]["message"]


def test_a_rejected_version_is_409_with_its_reason(client, adapter, good_adapter_dir):
    from registry.services.versions import adapter_version_validate

    upload(client, "support-bot", good_adapter_dir, config=b"[]")
    adapter_version_validate(version_id=AdapterVersion.objects.get().pk)
    response = put(client, "production", version=1)
    assert response.status_code == 409
    assert "v1 is rejected: config:" in response.json()["error"]["message"]


def test_an_unknown_version_is_400_naming_it(client, two_ready):
    response = put(client, "production", version=9)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "version"


def test_a_version_not_checked_against_the_current_base_revision_is_409(
    client, two_ready, base_model
):
    base_model.revision = "0" * 64  # a new revision was imported; the re-check has not run
    base_model.save()
    response = put(client, "production", version=1)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "version_incompatible"
    assert "not been checked" in response.json()["error"]["message"]


def test_delete_removes_the_alias_and_is_audited(client, two_ready):
    put(client, "production", version=1)
    assert client.delete(f"{ALIASES}/production/").status_code == 204
    assert Alias.objects.count() == 0
    event = AuditEvent.objects.get(verb="alias.delete")
    assert event.before == {"alias": "production", "version": 1, "weight": None}
    assert client.delete(f"{ALIASES}/production/").status_code == 404
