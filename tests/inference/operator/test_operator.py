"""The engine's operator endpoints: one route per action of the shared protocol, operators only
(the operator token, or a staff session with `registry.operate_engines` and the CSRF token).

No engine runs here (LORAPLEX_ENGINE=off): what is tested is routing, authorisation and
the refusals, which come before the engine is touched.
"""

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import Resolver404, resolve

from inference.errors import ModelNotFound, ProtocolError
from inference.host.engine_host import HOST
from inference.host.lora_loading import resolve_operator_name
from inference.operator import views
from platform_site import operator_protocol as protocol

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
        protocol.LIST: views.lora_adapters_list,
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


# ---------------------------------------------------------------- bodies: nothing is ignored


@pytest.mark.parametrize(
    ("action", "body", "param"),
    [
        (protocol.LOAD, {"lora_name": "tenant-a/bot", "lora_int_id": 3}, "lora_int_id"),
        (protocol.LOAD, {"lora_name": "tenant-a/bot", "base_model_name": "x"}, "base_model_name"),
        (protocol.UNLOAD, {"lora_name": "tenant-a/bot", "lora_int_id": 3}, "lora_int_id"),
        (protocol.PIN, {"lora_name": "tenant-a/bot", "lora_path": "/models/bot"}, "lora_path"),
        (protocol.UNPIN, {"lora_name": "tenant-a/bot", "load_inplace": True}, "load_inplace"),
    ],
)
def test_a_field_the_action_does_not_take_is_refused_by_name(action, body, param):
    response = call("POST", action, body=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "unknown_parameter" and error["param"] == param
    assert f"'{param}'" in error["message"] and "lora_name" in error["message"]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"lora_name": "tenant-a/bot", "lora_path": 7}, "lora_path", "must be a string"),
        ({"lora_name": "tenant-a/bot", "lora_path": "/x", "load_inplace": "yes"}, "load_inplace",
         "true or false"),
        ({"lora_name": "tenant-a/bot", "load_inplace": True}, "load_inplace", "lora_path"),
        ({"lora_name": "tenant-a/bot@production", "lora_path": "/x"}, "lora_name",
         "'<tenant>/<adapter>'"),
        ({"lora_name": "tenant-a/bot:2", "lora_path": "/x"}, "lora_name", "next version"),
        ({"lora_name": "bot", "lora_path": "/x"}, "lora_name", "'<tenant>/<adapter>'"),
        ({"lora_path": "/x"}, "lora_name", "'<tenant>/<adapter>'"),
    ],
)  # fmt: skip
def test_a_load_with_files_checks_its_fields_first(body, param, words):
    response = call("POST", protocol.LOAD, body=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["param"] == param
    assert words in error["message"]


# ---------------------------------------------------------------- what lora_path may name


@pytest.fixture
def roots(settings, tmp_path):
    """One folder open to operators' loads, with an adapter folder in it."""
    root = tmp_path / "open"
    (root / "run").mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (root / "run" / name).write_bytes(b"{}")
    settings.LORA_PATH_ROOTS = [str(root)]
    settings.ADAPTER_CACHE_DIR = root / "adapter-cache"  # an operator opened too much
    return root


def load_from(lora_path):
    body = {"lora_name": "tenant-a/bot", "lora_path": lora_path}
    return call("POST", protocol.LOAD, body=body)


def test_a_folder_under_a_root_passes_the_fences(roots):
    response = load_from(str(roots / "run"))
    # past every check of the body: the engine is next, and there is none here
    assert response.status_code == 503 and response.json()["error"]["code"] == "engine_unavailable"


def test_without_roots_no_local_folder_is_read(roots, settings):
    settings.LORA_PATH_ROOTS = []
    response = load_from(str(roots / "run"))
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "source_not_allowed"
    assert error["param"] == "lora_path" and "LORAPLEX_LORA_PATH_ROOTS" in error["message"]


@pytest.mark.parametrize(
    ("lora_path", "code", "words"),
    [
        ("relative/run", "invalid_source", "absolute"),
        ("https://example.com/run/", "invalid_source", "no other scheme"),
        ("s3://Bad_Bucket/run/", "invalid_source", "s3://bucket/prefix/"),
        ("s3://training/../run/", "invalid_source", "'..'"),
        ("s3://closed-bucket/run/", "source_not_allowed", "LORAPLEX_S3_IMPORT_BUCKETS"),
        ("", "invalid_source", "absolute folder path"),
        ("/" + "a" * 1100, "invalid_source", "at most 1024"),
        ("{root}/../elsewhere", "source_not_allowed", "LORAPLEX_LORA_PATH_ROOTS"),
        ("/etc", "source_not_allowed", "LORAPLEX_LORA_PATH_ROOTS"),
        ("/no/such/folder", "source_not_allowed", "LORAPLEX_LORA_PATH_ROOTS"),
        ("{root}/missing", "source_not_found", "does not exist"),
        ("{root}/run/adapter_config.json", "invalid_source", "not a folder"),
        ("{root}/escape", "source_not_allowed", "resolved"),
        ("{root}/adapter-cache/0f0f", "source_not_allowed", "tenants' files"),
    ],
)
def test_a_lora_path_outside_the_fences_is_refused_before_anything_is_read(
    roots, tmp_path, lora_path, code, words
):
    from registry.models import AdapterVersion

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (roots / "escape").symlink_to(outside)  # a symlink out of the root
    (roots / "adapter-cache" / "0f0f").mkdir(parents=True)  # a version staged for tenants
    response = load_from(lora_path.format(root=roots))
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == code and error["param"] == "lora_path"
    assert words in error["message"]
    assert AdapterVersion.objects.count() == 0
