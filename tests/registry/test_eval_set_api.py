"""/api/v1/adapters/{name}/eval-set/ (PUT multipart `file`, GET its summary) and the version
upload's optional `eval` part: clear refusals, nothing stored on any of them, and the same
isolation as every registry endpoint."""

import hashlib
import io
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from audit.models import AuditEvent
from registry.models import AdapterVersion, EvalSet
from registry.selectors import eval_set_for
from registry.services.eval_sets import eval_set_attach_default
from registry.services.evaluations import eval_set_rows
from tenants.scopes import INFERENCE, REGISTRY_READ, REGISTRY_WRITE
from tests.registry.conftest import files_of, stored_objects

pytestmark = pytest.mark.django_db

URL = "/api/v1/adapters/support-bot/eval-set/"
VERSIONS = "/api/v1/adapters/support-bot/versions/"
ROWS = [
    {"prompt": "2 + 2 =", "completion": " 4"},
    {"messages": [{"role": "user", "content": "Capital of France?"}], "completion": "Paris"},
]


def jsonl(*rows) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def put(client, data: bytes, field: str = "file"):
    body = {field: SimpleUploadedFile("eval.jsonl", data)}
    return client.put(URL, body, format="multipart")


def upload_with_eval(client, folder, data: bytes):
    body = files_of(folder) | {"eval": SimpleUploadedFile("eval.jsonl", data)}
    return client.post(VERSIONS, body, format="multipart")


@pytest.fixture
def alice_client(adapter, alice, user_client):
    return user_client(alice)


def nothing_stored():
    return not EvalSet.objects.exists() and stored_objects() == []


# ---------------------------------------------------------------- PUT and GET


def test_put_attaches_the_set_and_get_summarises_it(alice_client, adapter):
    data = jsonl(*ROWS)
    response = put(alice_client, data)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body == {
        "kind": "own",
        "base_model": None,
        "rows": 2,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "created_by": "user:alice@example.com",
        "created_at": body["created_at"],
    }
    assert alice_client.get(URL).json() == body
    assert [r.to_dict() for r in eval_set_rows(eval_set_for(adapter))] == ROWS
    trail = alice_client.get("/api/v1/audit/?verb=eval_set.attach").json()
    assert len(trail) == 1 and trail[0]["after"]["sha256"] == body["sha256"]


def test_put_replaces_and_the_same_bytes_answer_200(alice_client, adapter):
    first = put(alice_client, jsonl(ROWS[0])).json()
    again = put(alice_client, jsonl(ROWS[0]))
    assert again.status_code == 200 and again.json() == first
    second = put(alice_client, jsonl(*ROWS))
    assert second.status_code == 201 and second.json()["sha256"] != first["sha256"]
    assert alice_client.get(URL).json()["sha256"] == second.json()["sha256"]
    assert EvalSet.objects.filter(is_current=True).count() == 1


def test_a_bad_set_is_400_naming_the_line_and_stores_nothing(alice_client, adapter):
    data = jsonl(ROWS[0]) + b'{"prompt": "x", "completion": ""}\n'
    response = put(alice_client, data)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_eval_set" and error["param"] == "file"
    assert error["message"] == "line 2, completion: must be a non-empty string"
    assert nothing_stored()
    assert not AuditEvent.objects.filter(verb="eval_set.attach").exists()


def test_a_bad_set_leaves_the_current_one_in_place(alice_client, adapter):
    good = put(alice_client, jsonl(*ROWS)).json()
    response = put(alice_client, b"\xff\xfe not utf-8\n")
    assert response.json()["error"]["message"].startswith("line 1: not UTF-8")
    assert alice_client.get(URL).json() == good
    assert len(stored_objects()) == 1


def test_too_many_bytes_is_413_while_streaming(alice_client, adapter, settings):
    settings.EVAL_MAX_BYTES = 64
    response = put(alice_client, jsonl(*ROWS))
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "upload_too_large" and error["param"] == "file"
    assert "LORAPLEX_EVAL_MAX_BYTES" in error["message"]
    assert nothing_stored()


def test_too_many_rows_is_400(alice_client, adapter, settings):
    settings.EVAL_MAX_ROWS = 1
    error = put(alice_client, jsonl(*ROWS)).json()["error"]
    assert error["code"] == "invalid_eval_set"
    assert error["message"].startswith("line 2: the eval set has more than 1 rows")
    assert nothing_stored()


def test_another_file_field_or_none_is_refused(alice_client, adapter):
    response = put(alice_client, jsonl(*ROWS), field="eval")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unexpected_file"
    assert response.json()["error"]["param"] == "eval"
    response = alice_client.put(URL, {"note": "no file"}, format="multipart")
    assert response.status_code == 400 and response.json()["error"]["param"] == "file"
    response = alice_client.put(URL, {"file": "text"}, format="json")
    assert response.status_code == 415
    assert nothing_stored()


def test_get_falls_back_to_the_generic_set_then_404(alice_client, adapter, base_model):
    response = alice_client.get(URL)
    assert response.status_code == 404
    assert response.json()["error"]["message"] == (
        "adapter 'support-bot' has no eval set, and base model tiny-llama has no generic one; "
        "PUT one here (multipart 'file')"
    )
    eval_set_attach_default(
        base_model=base_model, file=io.BytesIO(jsonl(ROWS[0])), actor="system:operator"
    )
    body = alice_client.get(URL).json()
    assert body["kind"] == "generic" and body["base_model"] == "tiny-llama" and body["rows"] == 1
    put(alice_client, jsonl(*ROWS))
    assert alice_client.get(URL).json()["kind"] == "own"


# ---------------------------------------------------------------- the upload's `eval` part


def test_an_upload_with_an_eval_part_attaches_it(alice_client, adapter, good_adapter_dir):
    data = jsonl(*ROWS)
    response = upload_with_eval(alice_client, good_adapter_dir, data)
    assert response.status_code == 202, response.json()
    assert AdapterVersion.objects.get().number == response.json()["number"] == 1
    summary = alice_client.get(URL).json()
    assert summary["kind"] == "own" and summary["sha256"] == hashlib.sha256(data).hexdigest()
    assert len(stored_objects()) == 3  # config, weights, eval set
    verbs = set(AuditEvent.objects.values_list("verb", flat=True))
    assert {"version.upload", "eval_set.attach"} <= verbs


def test_a_bad_eval_part_refuses_the_whole_upload(alice_client, adapter, good_adapter_dir):
    response = upload_with_eval(alice_client, good_adapter_dir, b'{"prompt": "p"}\n')
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_eval_set" and error["param"] == "eval"
    assert error["message"].startswith("line 1, completion: missing")
    assert not AdapterVersion.objects.exists() and nothing_stored()
    assert not AuditEvent.objects.filter(verb__in=["version.upload", "eval_set.attach"]).exists()


def test_too_large_an_eval_part_is_413(alice_client, adapter, good_adapter_dir, settings):
    settings.EVAL_MAX_BYTES = 32
    response = upload_with_eval(alice_client, good_adapter_dir, jsonl(*ROWS))
    assert response.status_code == 413
    assert response.json()["error"]["param"] == "eval"
    assert not AdapterVersion.objects.exists() and nothing_stored()


def test_a_storage_failure_of_the_eval_part_stores_nothing(
    alice_client, adapter, good_adapter_dir, monkeypatch
):
    """The version's two objects are written before the eval set's: they go again."""
    from registry import objectstore
    from registry.errors import StorageUnavailable

    save = objectstore.save

    def failing_for_eval_sets(key, f):
        if "/eval-sets/" in key:
            raise StorageUnavailable("object storage failed to write eval_set.jsonl (OSError)")
        return save(key, f)

    monkeypatch.setattr(objectstore, "save", failing_for_eval_sets)
    response = upload_with_eval(alice_client, good_adapter_dir, jsonl(*ROWS))
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "storage_unavailable"
    assert not AdapterVersion.objects.exists() and nothing_stored()


def test_identical_version_bytes_still_attach_a_new_eval_part(
    alice_client, adapter, good_adapter_dir
):
    assert alice_client.post(VERSIONS, files_of(good_adapter_dir), format="multipart").status_code
    response = upload_with_eval(alice_client, good_adapter_dir, jsonl(*ROWS))
    assert response.status_code == 200 and response.json()["number"] == 1
    assert alice_client.get(URL).json()["rows"] == 2


# ---------------------------------------------------------------- who may


def test_a_read_key_reads_but_cannot_put(adapter, tenant_a, make_key, key_client):
    _, full = make_key(tenant_a, scopes=[REGISTRY_READ])
    client = key_client(full)
    assert client.get(URL).status_code == 404  # allowed: there is no set yet
    response = put(client, jsonl(*ROWS))
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "insufficient_scope"
    assert nothing_stored()
    _, inference_only = make_key(tenant_a, scopes=[INFERENCE], name="inference")
    assert key_client(inference_only).get(URL).status_code == 403


def test_a_write_key_puts(adapter, tenant_a, make_key, key_client):
    _, full = make_key(tenant_a, scopes=[REGISTRY_READ, REGISTRY_WRITE])
    response = put(key_client(full), jsonl(*ROWS))
    assert response.status_code == 201
    assert response.json()["created_by"].startswith("key:")


def test_a_member_cannot_put(adapter, bob, user_client):
    response = put(user_client(bob), jsonl(*ROWS))
    assert response.status_code == 403 and nothing_stored()


def test_another_tenants_adapter_is_404(
    adapter, base_model, tenant_b, make_key, key_client, charlie, user_client, good_adapter_dir
):
    eval_set_attach_default(
        base_model=base_model, file=io.BytesIO(jsonl(ROWS[0])), actor="system:operator"
    )
    _, full = make_key(tenant_b)
    for client in (key_client(full), user_client(charlie)):
        for response in (
            client.get(URL),
            put(client, jsonl(*ROWS)),
            upload_with_eval(client, good_adapter_dir, jsonl(*ROWS)),
        ):
            assert response.status_code == 404, response.content
            assert response.json()["error"] == {
                "message": "Not found.",
                "type": "not_found_error",
                "param": None,
                "code": "not_found",
            }
    assert not EvalSet.objects.filter(adapter__isnull=False).exists()
    assert not AdapterVersion.objects.exists()


def test_no_credentials_is_401(adapter, client):
    assert client.get(URL).status_code == 401
    assert client.put(URL, {"file": SimpleUploadedFile("e.jsonl", b"")}).status_code == 401


def test_the_schema_documents_the_endpoint(client):
    paths = client.get("/api/schema/?format=json").json()["paths"]
    assert {"get", "put"} <= set(paths["/api/v1/adapters/{name}/eval-set/"])
    put_body = paths["/api/v1/adapters/{name}/eval-set/"]["put"]["requestBody"]["content"]
    assert set(put_body) == {"multipart/form-data"}
    upload = paths["/api/v1/adapters/{name}/versions/"]["post"]["requestBody"]["content"]
    schema_ref = upload["multipart/form-data"]["schema"]["$ref"].rsplit("/", 1)[-1]
    schema = client.get("/api/schema/?format=json").json()["components"]["schemas"][schema_ref]
    assert "eval" in schema["properties"] and "eval" not in schema.get("required", [])


@pytest.mark.django_db(transaction=True)
def test_deleting_the_adapter_removes_the_stored_bytes(alice_client, adapter):
    put(alice_client, jsonl(*ROWS))
    assert alice_client.delete("/api/v1/adapters/support-bot/").status_code == 204
    assert not EvalSet.objects.exists()
    assert stored_objects() == []  # the files go after the commit


def test_the_served_body_limit_of_an_eval_set_put_is_the_eval_set_limit(settings):
    from platform_site.body_limits import route_limit

    settings.EVAL_MAX_BYTES = 5 << 20
    scope = {
        "type": "http",
        "method": "PUT",
        "path": URL,
        "headers": [(b"content-type", b"multipart/form-data; boundary=x")],
    }
    limit, refusal = route_limit(scope)
    assert limit > settings.EVAL_MAX_BYTES > settings.MAX_REQUEST_BYTES
    assert "LORAPLEX_EVAL_MAX_BYTES" in refusal(None, limit).message
