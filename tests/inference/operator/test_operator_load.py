"""vLLM's operator calls against a live `manage.py serve`: `POST /v1/load_lora_adapter` with
`lora_path` (a local folder, or an `s3://` prefix on moto's S3 server) registers the files as
the next version of `<tenant>/<adapter>` through the upload's validation and quality gate,
then loads and pins it; `LORAPLEX_LORA_MODULES` does the same at start-up.

The server reads and writes the test database (committed rows); the test reads them back
on a connection of its own (`committed`): its own transaction would not see them on SQLite.
serve_data's teardown deletes every adapter registered here with tenant serve-a.
"""

import json
import shutil
from types import SimpleNamespace

import httpx
import pytest

from platform_site import operator_protocol as protocol
from tests.inference.conftest import start_server, stop_server
from tests.processes import committed
from tests.registry.conftest import moto_endpoint  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db
TOKEN = "load-operator-token"
MODULE = "serve-a/modbot"  # what LORAPLEX_LORA_MODULES registers at start-up
MISSING_BUCKET = "loraplex-no-such-bucket"  # open for imports, never created


@pytest.fixture(scope="module")
def sources(serve_data, moto_endpoint, django_db_blocker):  # noqa: F811
    """Under one root open to operators: good files, other good files, bad files, a folder
    without weights; the good files also under a prefix of a bucket; and an adapter of
    serve-a with its own eval set (its versions await the quality gate's evaluation)."""
    import boto3

    from registry.services.adapters import adapter_create
    from tenants.models import Tenant
    from tests.registry.conftest import attach_eval_set

    root = serve_data["tmp"] / "loras"
    good = root / "good"
    shutil.copytree(serve_data["adapter_dir"], good)
    second = root / "second"  # other bytes, as good: another alpha
    shutil.copytree(good, second)
    config = json.loads((good / "adapter_config.json").read_text())
    config["lora_alpha"] = config["lora_alpha"] * 2
    (second / "adapter_config.json").write_text(json.dumps(config))
    bad = root / "bad"
    bad.mkdir()
    shutil.copy(good / "adapter_config.json", bad)
    (bad / "adapter_model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")
    no_weights = root / "no-weights"
    no_weights.mkdir()
    shutil.copy(good / "adapter_config.json", no_weights)

    s3 = boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    bucket = "loraplex-operator-loads"
    s3.create_bucket(Bucket=bucket)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        s3.put_object(Bucket=bucket, Key=f"runs/good/{name}", Body=(good / name).read_bytes())
    with django_db_blocker.unblock():
        gated = adapter_create(
            tenant=Tenant.objects.get(slug="serve-a"), name="gated", actor="test"
        )
        attach_eval_set(gated, actor="test")
    return SimpleNamespace(
        root=root,
        good=good,
        second=second,
        bad=bad,
        no_weights=no_weights,
        endpoint=moto_endpoint,
        bucket=bucket,
    )


@pytest.fixture(scope="module")
def server(serve_data, sources):
    url, proc, log = start_server(
        serve_data["tmp"],
        {
            "LORAPLEX_OPERATOR_TOKEN": TOKEN,
            "LORAPLEX_LORA_MODULES": f"{MODULE}={sources.good}",
            "LORAPLEX_LORA_PATH_ROOTS": str(sources.root),
            "LORAPLEX_LORA_LOAD_WAIT_SECONDS": "1",
            "LORAPLEX_S3_IMPORT_BUCKETS": f"{sources.bucket},{MISSING_BUCKET}",
            "LORAPLEX_S3_IMPORT_ENDPOINT_URL": sources.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "LORAPLEX_MAX_LORAS": "8",  # up to 7 pinned
            "LORAPLEX_MAX_CPU_LORAS": "10",
            "LORAPLEX_KV_CACHE_BYTES": str(16 * 1024 * 1024),
        },
        name="operator-load",
    )
    yield SimpleNamespace(url=url, log=log)
    stop_server(proc)


def load(server, body, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(
        server.url + protocol.path(protocol.LOAD), json=body, headers=headers, timeout=60
    )


def listed(server) -> dict[str, dict]:
    response = httpx.get(
        server.url + protocol.path(protocol.LIST),
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return {adapter["name"]: adapter for adapter in response.json()["data"]}


def versions_of(name: str) -> list:
    """The versions of `<tenant>/<adapter>` the server has committed, by number."""
    from registry.models import AdapterVersion

    tenant, adapter = name.split("/")
    versions = (
        AdapterVersion.objects.filter(adapter__tenant__slug=tenant, adapter__name=adapter)
        .select_related("adapter")
        .order_by("number")
    )
    return committed(lambda: list(versions))


def error_of(response: httpx.Response) -> dict:
    return response.json()["error"]


# ---------------------------------------------------------------- at start-up


def test_lora_modules_are_registered_loaded_and_pinned_at_start_up(server, sources):
    from audit.models import AuditEvent

    (version,) = versions_of(MODULE)
    assert version.status == "ready" and version.quality == "passed"
    assert version.source == "operator" and version.operator_source == str(sources.good.resolve())
    assert version.created_by == "operator:LORAPLEX_LORA_MODULES"
    upload = AuditEvent.objects.get(
        object_type="adapter_version",
        verb="version.upload",
        object_repr=version.label,
        tenant__slug="serve-a",
    )
    assert upload.actor == "operator:LORAPLEX_LORA_MODULES"
    loaded = listed(server)[f"{MODULE}:1"]
    assert loaded["pinned"] is True and loaded["loading"] is False


# ---------------------------------------------------------------- a local folder, an S3 prefix


def test_a_local_folder_becomes_a_version_that_serves(server, sources, live_engine_server_key):
    response = load(server, {"lora_name": "serve-a/folderbot", "lora_path": str(sources.good)})
    assert response.status_code == 200, response.text
    assert response.json() == {
        "lora_name": "serve-a/folderbot",
        "action": "load_lora_adapter",
        "status": "ok",
        "version": "serve-a/folderbot:1",
        "created": True,
    }
    assert listed(server)["serve-a/folderbot:1"]["pinned"] is True
    (version,) = versions_of("serve-a/folderbot")
    assert version.created_by == "operator" and version.source == "operator"
    assert version.operator_source == str(sources.good.resolve())  # for operators only
    reply = httpx.post(
        server.url + "/v1/completions",
        json={"model": "folderbot", "prompt": "Hello", "max_tokens": 2},
        headers={"Authorization": f"Bearer {live_engine_server_key}"},
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "folderbot"


def test_a_name_that_has_files_takes_new_ones_only_in_place(server, sources):
    name = "serve-a/inplacebot"
    first = {"lora_name": name, "lora_path": str(sources.good)}
    assert load(server, first).json()["version"] == f"{name}:1"
    repeated = load(server, first)  # the same call again: the same version
    assert repeated.status_code == 200, repeated.text
    assert repeated.json()["version"] == f"{name}:1" and repeated.json()["created"] is False

    again = load(server, {"lora_name": name, "lora_path": str(sources.second)})
    assert again.status_code == 409
    assert error_of(again)["code"] == "adapter_already_loaded"
    assert error_of(again)["param"] == "load_inplace" and f"{name}:1" in error_of(again)["message"]
    assert len(versions_of(name)) == 1  # nothing registered

    replaced = load(server, {**first, "lora_path": str(sources.second), "load_inplace": True})
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["version"] == f"{name}:2" and replaced.json()["created"] is True
    engine = listed(server)
    assert engine[f"{name}:2"]["pinned"] is True
    assert engine[f"{name}:1"]["pinned"] is False  # the name now serves the new files

    same = load(server, {**first, "lora_path": str(sources.second), "load_inplace": True})
    assert same.json()["version"] == f"{name}:2" and same.json()["created"] is False
    back = load(server, first)  # v1's files: no longer what the name's newest version holds
    assert back.status_code == 409 and error_of(back)["code"] == "adapter_already_loaded"
    assert [v.number for v in versions_of(name)] == [1, 2]


def test_an_s3_prefix_becomes_a_version(server, sources):
    lora_path = f"s3://{sources.bucket}/runs/good/"
    response = load(server, {"lora_name": "serve-a/s3bot", "lora_path": lora_path})
    assert response.status_code == 200, response.text
    assert response.json()["version"] == "serve-a/s3bot:1"
    assert listed(server)["serve-a/s3bot:1"]["pinned"] is True
    (version,) = versions_of("serve-a/s3bot")
    assert version.operator_source == lora_path and version.status == "ready"
    assert version.source == "operator"


# ---------------------------------------------------------------- refused


def test_bad_files_answer_the_validation_report_and_nothing_serves(server, sources):
    response = load(server, {"lora_name": "serve-a/badbot", "lora_path": str(sources.bad)})
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["code"] == "adapter_rejected" and error["param"] == "lora_path"
    assert error["version"] == "serve-a/badbot:1"
    failed = [check for check in error["report"] if not check["passed"]]
    assert failed and failed[0]["name"] in error["message"]
    (version,) = versions_of("serve-a/badbot")
    assert version.status == "rejected" and version.report == error["report"]
    assert not any(name.startswith("serve-a/badbot") for name in listed(server))


def test_a_version_awaiting_its_evaluation_is_not_loaded(server, sources):
    """No worker scores it here: after LORAPLEX_LORA_LOAD_WAIT_SECONDS, 409 saying so."""
    body = {"lora_name": "serve-a/gated", "lora_path": str(sources.good)}
    response = load(server, body)
    assert response.status_code == 409, response.text
    error = error_of(response)
    assert error["code"] == "model_not_servable" and error["param"] == "lora_name"
    assert "evaluation pending" in error["message"] and "load it again" in error["message"]
    (version,) = versions_of("serve-a/gated")
    assert version.status == "ready" and version.quality == "pending"
    assert not any(name.startswith("serve-a/gated") for name in listed(server))


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"lora_name": "nobody/bot"}, 404, "model_not_found", "lora_name"),
        ({"lora_name": "serve-a/nowbot", "lora_path": "s3://{bucket}/runs/none/"}, 400,
         "source_not_found", "lora_path"),
        ({"lora_name": "serve-a/nowbot", "lora_path": f"s3://{MISSING_BUCKET}/runs/good/"}, 400,
         "source_not_found", "lora_path"),
        ({"lora_name": "serve-a/nowbot", "lora_path": "{no_weights}"}, 400, "source_not_found",
         "lora_path"),
    ],
)  # fmt: skip
def test_sources_and_names_that_do_not_resolve_register_nothing(
    server, sources, body, status, code, param
):
    from registry.models import AdapterVersion

    before = committed(AdapterVersion.objects.count)
    body = {"lora_path": str(sources.good), **body}
    body["lora_path"] = body["lora_path"].format(
        bucket=sources.bucket, no_weights=sources.no_weights
    )
    response = load(server, body)
    assert response.status_code == status, response.text
    assert error_of(response)["code"] == code and error_of(response)["param"] == param
    assert committed(AdapterVersion.objects.count) == before
    assert versions_of("serve-a/nowbot") == []


def test_without_the_operator_token_nothing_is_registered(server, sources, live_engine_server_key):
    body = {"lora_name": "serve-a/sneakybot", "lora_path": str(sources.good)}
    assert load(server, body, token=None).status_code == 401
    wrong = load(server, body, token="guess")
    assert wrong.status_code == 403 and error_of(wrong)["code"] == "operator_only"
    tenant = load(server, body, token=live_engine_server_key)  # a tenant's key is no operator
    assert tenant.status_code == 403 and error_of(tenant)["code"] == "operator_only"
    assert versions_of("serve-a/sneakybot") == []


@pytest.fixture(scope="module")
def live_engine_server_key(serve_data):
    """Tenant A's key (inference scope), as serve_data made it."""
    return serve_data["keys"][0]


def test_without_lora_path_the_registered_version_is_loaded_as_before(server):
    response = load(server, {"lora_name": "serve-a/pirate"})
    assert response.status_code == 200, response.text
    assert response.json() == {
        "lora_name": "serve-a/pirate",
        "action": "load_lora_adapter",
        "status": "ok",
    }
    assert listed(server)["serve-a/pirate:1"]["pinned"] is True


# ---------------------------------------------------------------- what the tenant sees


@pytest.fixture(scope="module")
def signed_in(serve_data, django_db_blocker):
    """Session cookies on the live server: a member of serve-a, and a superuser (the admin)."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    from tenants.models import Tenant
    from tenants.scopes import MEMBER
    from tenants.services import membership_set, user_get_or_create

    def session_of(user) -> dict:
        browser = Client()
        browser.force_login(user)
        return {settings.SESSION_COOKIE_NAME: browser.cookies[settings.SESSION_COOKIE_NAME].value}

    with django_db_blocker.unblock():
        member = user_get_or_create(email="path-reader@example.com")
        membership_set(tenant=Tenant.objects.get(slug="serve-a"), user=member, role=MEMBER)
        root = get_user_model().objects.create_superuser("path-root", "root@example.com", "x")
        cookies = SimpleNamespace(member=session_of(member), operator=session_of(root))
    yield cookies
    with django_db_blocker.unblock():
        get_user_model().objects.filter(pk__in=[member.pk, root.pk]).delete()


def test_the_tenant_never_sees_where_the_operator_read_the_files(
    server, sources, serve_data, signed_in
):
    """The API, the pages and the audit trail say `operator`; the admin keeps the path."""
    loaded = load(server, {"lora_name": "serve-a/pathbot", "lora_path": str(sources.good)})
    assert loaded.status_code == 200, loaded.text
    bad = load(server, {"lora_name": "serve-a/pathbadbot", "lora_path": str(sources.bad)})
    assert bad.status_code == 400, bad.text  # rejected: the tenant still sees the version

    key_ro = serve_data["keys"][2]
    api = httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {key_ro}"}, timeout=30
    )
    pages = httpx.Client(base_url=server.url, cookies=signed_in.member, timeout=30)
    answers = {
        "versions": api.get("/api/v1/adapters/pathbot/versions/"),
        "version": api.get("/api/v1/adapters/pathbot/versions/1/"),
        "rejected": api.get("/api/v1/adapters/pathbadbot/versions/1/"),
        "audit": api.get("/api/v1/audit/", params={"limit": 1000}),
        "adapters page": pages.get("/adapters/"),
        "adapter page": pages.get("/adapters/pathbot/"),
        "rejected page": pages.get("/adapters/pathbadbot/"),
        "status fragment": pages.get("/adapters/pathbot/versions/1/status/"),
    }
    for seen, answer in answers.items():
        assert answer.status_code == 200, (seen, answer.text[:500])
        for path in {str(sources.root), str(sources.root.resolve())}:
            assert path not in answer.text, seen
    assert answers["version"].json()["source"] == "operator"
    assert answers["rejected"].json()["source"] == "operator"
    assert "source operator" in answers["adapter page"].text
    uploads = [
        event
        for event in answers["audit"].json()
        if event["verb"] == "version.upload" and event["object"].startswith("path")
    ]
    assert len(uploads) == 2 and all(e["after"]["source"] == "operator" for e in uploads)

    (version,) = versions_of("serve-a/pathbot")
    admin = httpx.get(
        f"{server.url}/admin/registry/adapterversion/{version.pk}/change/",
        cookies=signed_in.operator,
        timeout=30,
    )
    assert admin.status_code == 200 and str(sources.good.resolve()) in admin.text
