"""The engine's operator endpoints: one route per action of the shared protocol, operators only
(the operator token, or a staff session with `registry.operate_engines` and the CSRF token).

No engine runs here (LORAPLEX_ENGINE=off): what is tested is routing, authorisation and
the refusals, which come before the engine is touched.
"""

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import Resolver404, resolve

from inference import operator_protocol as protocol
from inference import views
from inference.engine_host import HOST
from inference.errors import ModelNotFound, ProtocolError
from inference.operator import resolve_operator_name

pytestmark = pytest.mark.django_db
TOKEN = "operator-secret"


@pytest.fixture(autouse=True)
def no_engine(settings):
    settings.ENGINE_ENABLED = False
    settings.OPERATOR_TOKEN = TOKEN


def call(method: str, action: str, token: str | None = TOKEN, body=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    client = Client()
    if method == "GET":
        return client.get(protocol.path(action), headers=headers)
    return client.post(
        protocol.path(action), body or {}, content_type="application/json", headers=headers
    )


def test_each_protocol_action_has_its_own_view():
    routes = {
        protocol.LOAD: views.load_lora_adapter,
        protocol.UNLOAD: views.unload_lora_adapter,
        protocol.PIN: views.pin_lora_adapter,
        protocol.UNPIN: views.unpin_lora_adapter,
        protocol.LIST: views.lora_adapters,
    }
    for action, view in routes.items():
        assert resolve(protocol.path(action)).func is view, action


def test_an_unknown_operator_path_is_not_answered_by_the_operator_views():
    with pytest.raises(Resolver404):
        resolve(protocol.path("frobnicate_lora_adapter"))
    assert call("POST", "frobnicate_lora_adapter").status_code == 404


@pytest.mark.parametrize("action", [protocol.LOAD, protocol.PIN, protocol.LIST])
def test_operator_endpoints_need_the_token_or_staff(action):
    method = "GET" if action == protocol.LIST else "POST"
    missing = call(method, action, token=None)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"
    wrong = call(method, action, token="guess")
    assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "operator_only"


def test_the_wrong_method_is_405_naming_the_right_one():
    response = call("GET", protocol.PIN)
    assert response.status_code == 405 and response["Allow"] == "POST"
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_without_an_engine_actions_are_503_and_the_listing_is_empty():
    response = call("POST", protocol.PIN, body={protocol.LORA_NAME: "tenant-a/bot"})
    assert response.status_code == 503 and response.json()["error"]["code"] == "engine_unavailable"
    assert call("GET", protocol.LIST).json() == {"object": "list", "data": []}


@pytest.fixture
def staff(django_user_model):
    """staff(operate=...) -> a signed-in staff member's client that enforces CSRF."""

    def make(*, operate: bool):
        user = django_user_model.objects.create_user("ops", password="pw", is_staff=True)
        if operate:
            user.user_permissions.add(Permission.objects.get(codename="operate_engines"))
        client = Client(enforce_csrf_checks=True)
        client.force_login(user)
        return client

    return make


def test_a_staff_session_with_the_permission_is_an_operator(staff):
    assert staff(operate=True).get(protocol.path(protocol.LIST)).status_code == 200


@pytest.mark.parametrize("action", [protocol.LOAD, protocol.UNLOAD, protocol.PIN, protocol.LIST])
def test_being_staff_is_not_enough(staff, action):
    client = staff(operate=False)
    if action == protocol.LIST:
        response = client.get(protocol.path(action))
    else:
        response = client.post(protocol.path(action), {}, content_type="application/json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "operator_only"
    assert "registry.operate_engines" in response.json()["error"]["message"]


def test_a_staff_sessions_post_without_the_csrf_token_is_refused(staff):
    client = staff(operate=True)
    body = {protocol.LORA_NAME: "tenant-a/bot"}
    forged = client.post(protocol.path(protocol.PIN), body, content_type="application/json")
    assert forged.status_code == 403 and forged.json()["error"]["code"] == "csrf_failed"

    client.get("/admin/")  # a page of the site sets the CSRF cookie, as in a browser
    token = client.cookies["csrftoken"].value
    answered = client.post(
        protocol.path(protocol.PIN),
        body,
        content_type="application/json",
        headers={"X-CSRFToken": token},
    )  # past authorisation: no engine runs here
    assert answered.status_code == 503
    assert answered.json()["error"]["code"] == "engine_unavailable"


def test_the_listing_shows_no_local_paths(monkeypatch):
    class Engine:
        async def list_loras(self):
            return [
                {
                    "name": "tenant-a/bot:1",
                    "adapter_id": "0f" * 16,
                    "path": "/var/lib/loraplex/adapter-cache/0f0f",
                    "tier": "device",
                    "slot": 0,
                    "pinned": True,
                    "loading": False,
                    "rank": 8,
                    "running": 1,
                    "waiting": 0,
                }
            ]

    monkeypatch.setattr(HOST, "engine", Engine())
    response = call("GET", protocol.LIST)
    assert response.status_code == 200
    (listed,) = response.json()["data"]
    assert "path" not in listed and "/var/lib" not in response.content.decode()
    assert listed["name"] == "tenant-a/bot:1" and listed["tier"] == "device"


@pytest.mark.parametrize("name", [None, "bot", "tenant-a/", "tenant-a/Bot", 42])
def test_a_lora_name_must_be_qualified(name):
    with pytest.raises(ProtocolError) as caught:
        resolve_operator_name(name)
    assert caught.value.param == protocol.LORA_NAME


def test_an_unknown_tenant_is_model_not_found(db):
    with pytest.raises(ModelNotFound) as caught:
        resolve_operator_name("ghost/bot")
    assert caught.value.param == protocol.LORA_NAME and "ghost/bot" in caught.value.message
