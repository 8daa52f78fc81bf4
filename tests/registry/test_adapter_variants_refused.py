"""A broken PEFT variant is rejected with a report naming what is wrong: DoRA without its
magnitudes or with one of the wrong length, magnitudes without use_dora, a modules_to_save
head missing or too big, a module other than the heads saved whole, ranks and alphas that
their patterns do not explain or the platform does not allow.

Uploaded through the REST API and validated by the worker's service in this process, as
tests/registry/test_bad_inputs.py does for plain adapters, on the tiny Llama of
tests/tiny_models.py (the variants' base).
"""

import json
from pathlib import Path

import pytest

from registry.models import AdapterVersion
from registry.services.base_models import base_model_import
from tests.registry.conftest import upload
from tests.registry.peft_variants import VARIANTS

pytestmark = pytest.mark.django_db


def edited(folder: Path, dest: Path, *, config=None, tensors=None) -> Path:
    """A copy of a PEFT folder whose config and tensors pass through the given edits."""
    from safetensors.torch import load_file, save_file

    dest.mkdir()
    doc = json.loads((folder / "adapter_config.json").read_text())
    (dest / "adapter_config.json").write_text(json.dumps(config(doc) if config else doc))
    weights = load_file(folder / "adapter_model.safetensors")
    save_file(tensors(weights) if tensors else weights, dest / "adapter_model.safetensors")
    return dest


def without(word: str):
    return lambda weights: {k: v for k, v in weights.items() if word not in k}


def first_magnitude_cut(weights):
    name = next(k for k in sorted(weights) if k.endswith("lora_magnitude_vector"))
    return weights | {name: weights[name][:-1].clone()}


def config_set(**changes):
    return lambda doc: doc | changes


# (id, variant it starts from, edits, words the report's message and the status detail hold)
BAD_VARIANTS = [
    ("dora_without_magnitudes", "dora", {"tensors": without("lora_magnitude_vector")},
     ("use_dora", "lora_magnitude_vector", "self_attn.q_proj")),
    ("dora_magnitude_too_short", "dora", {"tensors": first_magnitude_cut},
     ("q_proj.lora_magnitude_vector has 63 values", "64 outputs")),
    ("magnitudes_without_use_dora", "dora", {"config": config_set(use_dora=False)},
     ("lora_magnitude_vector", "use_dora")),
    ("saved_head_missing", "modules_to_save_lm_head", {"tensors": without("lm_head")},
     ("modules_to_save", "lm_head", "no copy")),
    ("saved_module_not_a_head", "dora",
     {"config": config_set(use_dora=False, modules_to_save=["norm"]),
      "tensors": without("lora_magnitude_vector")},
     ("modules_to_save", "'norm'", "embed_tokens and lm_head")),
    ("rank_pattern_disagrees_with_tensors", "rank_pattern",
     {"config": config_set(rank_pattern={})}, ("v_proj.lora_A.weight has rank 8 but r is 4",)),
    ("alpha_pattern_not_a_number", "alpha_pattern",
     {"config": config_set(alpha_pattern={"v_proj": "high"})},
     ("alpha_pattern", "'v_proj'", "'high'")),
]  # fmt: skip


@pytest.fixture
def llama_adapter(tenant_a, family_base_dir):
    """An adapter of tenant A on the tiny Llama of tests/tiny_models.py (the variants' base)."""
    from registry.services.adapters import adapter_create

    base, _ = base_model_import(name="tiny-llama", path=family_base_dir("llama"), default=True)
    return adapter_create(tenant=tenant_a, name="bot", actor="test", base_model_name=base.name)


def validated(client, adapter, folder: Path) -> dict:
    """Upload through the API, validate with the worker's service; the version's body."""
    from registry.services.versions import adapter_version_validate

    response = upload(client, adapter.name, folder)
    assert response.status_code == 202, response.json()
    number = response.json()["number"]
    adapter_version_validate(
        version_id=AdapterVersion.objects.get(adapter=adapter, number=number).pk
    )
    return client.get(response.json()["url"]).json()


def test_the_unbroken_variants_are_ready_on_this_base(
    llama_adapter, alice, user_client, variant_dir
):
    client = user_client(alice)
    for variant in VARIANTS:
        body = validated(client, llama_adapter, variant_dir("llama", variant))
        assert body["status"] == "ready", (variant, body["status_detail"])


@pytest.mark.parametrize("case", BAD_VARIANTS, ids=[c[0] for c in BAD_VARIANTS])
def test_a_broken_variant_is_rejected_with_a_report_naming_the_problem(
    case, llama_adapter, alice, user_client, variant_dir, tmp_path
):
    _, variant, edits, words = case
    folder = edited(variant_dir("llama", variant), tmp_path / "bad", **edits)
    body = validated(user_client(alice), llama_adapter, folder)
    assert body["status"] == "rejected", body["status_detail"]
    failed = {c["name"]: c["message"] for c in body["report"] if not c["passed"]}
    assert any(all(w in m for w in words) for m in failed.values()), failed
    assert all(w in body["status_detail"] for w in words)


def test_a_pattern_rank_above_the_maximum_is_rejected(
    llama_adapter, alice, user_client, variant_dir, settings
):
    settings.MAX_LORA_RANK = 4  # r is 4; the pattern raises one module to 8
    body = validated(user_client(alice), llama_adapter, variant_dir("llama", "rank_pattern"))
    assert body["status"] == "rejected"
    detail = body["status_detail"]
    assert all(w in detail for w in ("rank_pattern", "v_proj", "rank 8", "maximum LoRA rank 4"))


def test_a_saved_head_above_the_platforms_limit_is_rejected(
    llama_adapter, alice, user_client, variant_dir, settings
):
    """The validator holds saved heads to the limit the engine loads them under."""
    settings.MAX_SAVED_MODULE_PARAMS = 1000  # the head has 384 x 64
    body = validated(
        user_client(alice), llama_adapter, variant_dir("llama", "modules_to_save_lm_head")
    )
    assert body["status"] == "rejected"
    detail = body["status_detail"]
    assert all(
        w in detail for w in ("lm_head", "24,576", "1,000", "LORAPLEX_MAX_SAVED_MODULE_PARAMS")
    )
