"""Every bad input gets a clear answer naming the problem, and nothing half-written stays.

Content problems are accepted as uploads and end `rejected` with a report (the validator
is the one place content rules run); transport problems (size, missing parts, names,
sources) are refused at once with a 4xx and leave no object, no row and no temp file.
"""

import io
import json

import pytest
import torch
from safetensors.torch import load, save

from registry.models import AdapterVersion
from registry.services.versions import adapter_version_validate
from tests.peft_adapters import make_peft_adapter
from tests.registry import safetensors_edit as st
from tests.registry.conftest import BASE_NAME, stored_objects, upload
from tests.tiny_llama import make_tiny_llama

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(adapter, alice, user_client):
    return user_client(alice)


@pytest.fixture(scope="module")
def dora_dir(tiny_base_dir, tmp_path_factory):
    return make_peft_adapter(
        tiny_base_dir, tmp_path_factory.mktemp("dora"), rank=4, alpha=8, use_dora=True
    )


@pytest.fixture(scope="module")
def other_model_adapter_dir(tmp_path_factory):
    """A real adapter for a Llama with hidden size 96: right names, wrong shapes."""
    base = make_tiny_llama(tmp_path_factory.mktemp("wide-base"), hidden=96, heads=4, kv_heads=2)
    return make_peft_adapter(base, tmp_path_factory.mktemp("wide"), rank=4, alpha=8)


def good(folder) -> tuple[bytes, bytes]:
    return (folder / "adapter_config.json").read_bytes(), (
        folder / "adapter_model.safetensors"
    ).read_bytes()


def with_config(config: bytes, **changes) -> bytes:
    doc = json.loads(config)
    for key, value in changes.items():
        if value is DELETE:
            doc.pop(key, None)
        else:
            doc[key] = value
    return json.dumps(doc).encode()


DELETE = object()


def pickled(weights: bytes, *, zip_format: bool) -> bytes:
    """The same tensors as a torch .bin (zip) or legacy pickle file."""
    buffer = io.BytesIO()
    torch.save(load(weights), buffer, _use_new_zipfile_serialization=zip_format)
    return buffer.getvalue()


def weights_by(edit, *args, **kwargs):
    """A mutation that passes the weights through edit(weights, *args, **kwargs)."""
    return lambda config, weights: (config, edit(weights, *args, **kwargs))


def config_with(**changes):
    return lambda config, weights: (with_config(config, **changes), weights)


def config_of(text: bytes):
    return lambda config, weights: (text, weights)


def halved(weights: bytes) -> bytes:
    return weights[: len(weights) // 2]


def header_length(weights: bytes, length: int) -> bytes:
    return length.to_bytes(8, "little") + weights[8:]


def header_past_end(weights: bytes) -> bytes:
    return header_length(weights, len(weights) + 100)


def random_file(weights: bytes) -> bytes:
    """Some other file uploaded as weights: its first 8 bytes read as a huge header length."""
    return bytes(range(7, 256)) * 40


# (id, mutate(config, weights) -> (config, weights), failing check, words the message must hold)
# fmt: off
CONTENT_CASES = [
    ("truncated", weights_by(halved), "safetensors", "outside"),
    ("header_length_beyond_file", weights_by(header_past_end), "safetensors", "runs past the end"),
    ("header_not_json", weights_by(st.garble_header), "safetensors", "not valid JSON"),
    ("header_over_size_limit", weights_by(header_length, 17 * 1024 * 1024), "safetensors",
     "above the limit"),
    ("not_safetensors_at_all", weights_by(random_file), "safetensors",
     "not a safetensors file"),
    ("overlapping_offsets", weights_by(st.shift_last_tensor, -4), "safetensors", "overlap"),
    ("offsets_out_of_file", weights_by(st.shift_last_tensor, 4), "safetensors", "outside"),
    ("unknown_dtype", weights_by(st.edit_last_tensor, dtype="F128"), "safetensors",
     "unknown dtype 'F128'"),
    # Python's json takes Infinity; JSON and the Rust loader do not
    ("non_standard_json_constant", weights_by(st.edit_last_tensor, extra=float("inf")),
     "safetensors", "Infinity is not a JSON value"),
    ("pickle_zip", weights_by(pickled, zip_format=True), "safetensors", "PyTorch pickle"),
    ("pickle_legacy", weights_by(pickled, zip_format=False), "safetensors", "PyTorch pickle"),
    ("unknown_module_name", weights_by(st.rename, "self_attn.q_proj", "self_attn.query"), "modules",
     "no such module"),
    ("nul_in_tensor_name",
     weights_by(st.rename, "layers.0.self_attn.q_proj", "layers.0.self_attn.q\x00proj"),
     "modules", "q\\x00proj"),
    ("names_without_peft_prefix", weights_by(st.rename, "base_model.model.", ""), "tensor_names",
     "names must look like"),
    ("layer_index_out_of_range", weights_by(st.rename, "layers.1.", "layers.7."), "layers",
     "found layer 7"),
    ("nan_weights", weights_by(st.poison_first_float, float("nan")), "finite", "NaN or Inf"),
    ("inf_weights", weights_by(st.poison_first_float, float("inf")), "finite", "NaN or Inf"),
    ("modules_to_save_of_a_layer_norm", config_with(modules_to_save=["norm"]), "saved_modules",
     "only embed_tokens and lm_head are served whole"),
    ("missing_r", config_with(r=DELETE), "r", "positive integer"),
    ("missing_lora_alpha", config_with(lora_alpha=DELETE), "lora_alpha", "positive number"),
    ("missing_peft_type", config_with(peft_type=DELETE), "peft_type", "LORA"),
    ("config_not_json", config_of(b"{r: 4"), "config", "not valid JSON"),
    ("config_not_an_object", config_of(b"[4, 8]"), "config", "JSON object"),
    ("rank_in_config_disagrees_with_tensors", config_with(r=2), "tensor_rank", "but r is 2"),
]
# fmt: on


def rejected_report(client, adapter, config: bytes, weights: bytes) -> dict:
    response = upload(client, adapter.name, None, config=config, weights=weights)
    assert response.status_code == 202, response.json()
    version = AdapterVersion.objects.get(adapter=adapter, number=response.json()["number"])
    adapter_version_validate(version_id=version.pk)
    body = client.get(response.json()["url"]).json()
    assert body["status"] == "rejected", body
    assert body["compatible"] is False
    return body


@pytest.mark.parametrize("case", CONTENT_CASES, ids=[c[0] for c in CONTENT_CASES])
def test_bad_content_is_rejected_with_a_report_naming_the_problem(
    case, client, adapter, good_adapter_dir
):
    _, mutate, check, words = case
    config, weights = mutate(*good(good_adapter_dir))
    body = rejected_report(client, adapter, config, weights)
    failed = {c["name"]: c["message"] for c in body["report"] if not c["passed"]}
    assert check in failed, body["report"]
    assert words in failed[check], failed[check]
    assert words in body["status_detail"]


def test_shapes_for_another_model_are_rejected(client, adapter, other_model_adapter_dir):
    body = rejected_report(client, adapter, *good(other_model_adapter_dir))
    failed = {c["name"]: c["message"] for c in body["report"] if not c["passed"]}
    assert "the base model needs [4, 64]" in failed["shapes"], failed


def test_rank_above_the_deployment_maximum_is_rejected(client, adapter, good_adapter_dir, settings):
    settings.MAX_LORA_RANK = 2
    body = rejected_report(client, adapter, *good(good_adapter_dir))
    failed = {c["name"]: c["message"] for c in body["report"] if not c["passed"]}
    assert "r is 4, above this platform's maximum LoRA rank 2" in failed["r"]


def test_dora_without_its_magnitudes_is_rejected(client, adapter, dora_dir):
    """DoRA is served; one whose magnitude vectors are missing is not."""
    config, weights = good(dora_dir)
    tensors = {k: v for k, v in load(weights).items() if "lora_magnitude_vector" not in k}
    body = rejected_report(client, adapter, config, save(tensors))
    failed = {c["name"]: c["message"] for c in body["report"] if not c["passed"]}
    assert "needs a lora_magnitude_vector per adapted module" in failed["dora"]


def test_a_foreign_base_model_name_is_a_warning_not_a_rejection(client, adapter, good_adapter_dir):
    config, weights = good(good_adapter_dir)
    config = with_config(config, base_model_name_or_path="meta-llama/Llama-3.1-8B")
    response = upload(client, adapter.name, None, config=config, weights=weights)
    adapter_version_validate(version_id=AdapterVersion.objects.get().pk)
    body = client.get(response.json()["url"]).json()
    assert body["status"] == "ready"
    warning = next(c for c in body["report"] if c["name"] == "base_model")
    assert warning["level"] == "warning" and not warning["passed"]
    assert "Llama-3.1-8B" in warning["message"] and BASE_NAME in warning["message"]


# ---------------------------------------------------------------- refused at the door


@pytest.fixture
def upload_tmp(settings, tmp_path):
    folder = tmp_path / "uploads"
    folder.mkdir()
    settings.FILE_UPLOAD_TEMP_DIR = str(folder)
    return folder


def assert_nothing_written(upload_tmp):
    assert stored_objects() == []
    assert AdapterVersion.objects.count() == 0
    assert list(upload_tmp.iterdir()) == []


def test_an_oversized_weights_file_is_413_while_streaming(
    client, adapter, good_adapter_dir, settings, upload_tmp
):
    settings.MAX_ADAPTER_BYTES = 1000
    response = upload(client, adapter.name, good_adapter_dir)
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "upload_too_large"
    assert "weights" in error["message"] and "1000 bytes" in error["message"]
    assert_nothing_written(upload_tmp)


def test_a_request_announcing_too_many_bytes_is_413_before_reading(
    client, adapter, good_adapter_dir, settings, upload_tmp
):
    settings.MAX_ADAPTER_BYTES = 1000
    # More than the config's 1 MiB and the optional eval set's LORAPLEX_EVAL_MAX_BYTES together.
    weights = b"\0" * (1024 * 1024 + settings.EVAL_MAX_BYTES + 128 * 1024)
    response = upload(client, adapter.name, good_adapter_dir, weights=weights)
    assert response.status_code == 413
    assert "request is" in response.json()["error"]["message"]
    assert_nothing_written(upload_tmp)


def test_an_oversized_config_is_413(client, adapter, good_adapter_dir, upload_tmp):
    response = upload(client, adapter.name, good_adapter_dir, config=b" " * (1024 * 1024 + 1))
    assert response.status_code == 413
    assert "config" in response.json()["error"]["message"]
    assert_nothing_written(upload_tmp)


@pytest.mark.parametrize("missing", ["config", "weights"])
def test_a_missing_file_is_400_naming_it(missing, client, adapter, good_adapter_dir, upload_tmp):
    from tests.registry.conftest import files_of

    files = files_of(good_adapter_dir)
    del files[missing]
    response = client.post("/api/v1/adapters/support-bot/versions/", files, format="multipart")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == missing
    assert_nothing_written(upload_tmp)


def test_an_empty_file_is_400(client, adapter, good_adapter_dir, upload_tmp):
    response = upload(client, adapter.name, good_adapter_dir, weights=b"")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "weights"
    assert_nothing_written(upload_tmp)


def test_an_unexpected_file_field_is_400(client, adapter, good_adapter_dir, upload_tmp):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from tests.registry.conftest import files_of

    files = files_of(good_adapter_dir) | {"model": SimpleUploadedFile("pytorch_model.bin", b"x")}
    response = client.post("/api/v1/adapters/support-bot/versions/", files, format="multipart")
    assert response.status_code == 400
    assert "unexpected file field 'model'" in response.json()["error"]["message"]
    assert_nothing_written(upload_tmp)


def test_uploaded_file_names_never_reach_storage_keys(client, adapter, good_adapter_dir):
    response = upload(
        client, adapter.name, good_adapter_dir, weights_name="../../../etc/passwd.safetensors"
    )
    assert response.status_code == 202
    keys = stored_objects()
    assert all(".." not in k and "passwd" not in k for k in keys), keys
    assert sorted(k.rsplit("/", 1)[1] for k in keys) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]


@pytest.mark.parametrize(
    "name",
    [
        "../etc",
        "..",
        "a/b",
        "a\\b",
        "Upper",
        "a@b",
        "a:b",
        "",
        " x",
        "x" * 64,
        "-x",
        "é",
        BASE_NAME,
    ],
)
def test_bad_adapter_names_are_400_naming_the_field(name, client, adapter):
    response = client.post("/api/v1/adapters/", {"name": name}, format="json")
    assert response.status_code == 400, (name, response.json())
    assert response.json()["error"]["param"] == "name"


@pytest.mark.parametrize(
    "alias, code",
    [
        ("latest", "reserved_alias"),
        ("v2", "reserved_alias"),
        ("v0", "reserved_alias"),
        ("Prod", "invalid_alias"),
        ("a.b", "invalid_alias"),
        ("..", "invalid_alias"),
        ("%2e%2e", "invalid_alias"),
    ],
)
def test_bad_alias_names_are_400(alias, code, client, adapter, good_adapter_dir):
    from tests.registry.conftest import make_ready_version

    make_ready_version(adapter, good_adapter_dir)
    response = client.put(
        f"/api/v1/adapters/support-bot/aliases/{alias}/", {"version": 1}, format="json"
    )
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["code"] == code


@pytest.mark.parametrize(
    "source, words",
    [
        ("s3://training/../other-tenant/", "'.', '..'"),
        ("s3://training/a/./b/", "'.', '..'"),
        ("s3://training/a//b/", "empty segments"),
        ("http://training/a/", "s3://bucket/prefix/"),
        ("s3://not-allowed/a/", "not under an import prefix of this tenant (s3://training/)"),
        ("s3:///a/", "s3://bucket/prefix/"),
    ],
)
def test_bad_import_sources_are_400_naming_the_source(
    source, words, client, adapter, settings, upload_tmp
):
    settings.S3_IMPORT_BUCKETS = ["training"]
    adapter.tenant.s3_import_prefixes = "s3://training/"
    adapter.tenant.save()
    response = client.post(
        "/api/v1/adapters/support-bot/versions/", {"source": source}, format="json"
    )
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["param"] == "source"
    assert words in response.json()["error"]["message"]
    assert_nothing_written(upload_tmp)


def test_the_deployments_own_bucket_is_never_importable(client, adapter, settings):
    settings.S3_BUCKET = "loraplex-objects"
    settings.S3_IMPORT_BUCKETS = ["loraplex-objects"]
    adapter.tenant.s3_import_prefixes = "s3://loraplex-objects/"  # an operator's slip
    adapter.tenant.save()
    response = client.post(
        "/api/v1/adapters/support-bot/versions/",
        {"source": "s3://loraplex-objects/adapters/2/7/abc/"},
        format="json",
    )
    assert response.status_code == 400
    assert "not open for imports" in response.json()["error"]["message"]
