"""Every PEFT LoRA variant (tests/registry/peft_variants.py) is an ordinary adapter to the
registry: uploaded through the REST API it ends `ready` through the real validation worker and
is staged like any other, and it passes the re-check on a new base revision.

The quality gate's scoring on a live engine: test_adapter_variants_scored.py; broken
variants: test_adapter_variants_refused.py.
"""

from pathlib import Path

import pytest

from inference.engine.formats.safetensors_header import parse_header
from registry.models import AdapterVersion
from registry.services.base_models import base_model_import, base_model_recheck
from tests.registry.conftest import make_ready_version, sha256_of, upload
from tests.registry.peft_variants import VARIANT_FAMILIES, VARIANTS, import_family
from tests.tiny_models import make_tiny_model
from tests.waiting import wait_for


def tensor_shapes(folder: Path) -> dict[str, list[int]]:
    header = parse_header(folder / "adapter_model.safetensors")
    return {name: list(info.shape) for name, info in header.tensors.items()}


def test_the_variant_adapters_hold_what_they_are_named_for(variant_dir):
    """The fixtures are what the tests say they are (PEFT wrote the variant's tensors)."""
    for family in ("llama", "phi3"):
        attn = "qkv_proj" if family == "phi3" else "q_proj"
        other = "gate_up_proj" if family == "phi3" else "v_proj"
        shapes = tensor_shapes(variant_dir(family, "rank_pattern"))
        ranks = {
            name.split(".layers.")[1].rsplit(".lora_A", 1)[0]: shape[0]
            for name, shape in shapes.items()
            if name.endswith("lora_A.weight")
        }
        parent = "mlp" if family == "phi3" else "self_attn"
        assert ranks == {
            f"0.self_attn.{attn}": 4,
            f"1.self_attn.{attn}": 2,
            f"0.{parent}.{other}": 8,
            f"1.{parent}.{other}": 8,
        }
        names = list(tensor_shapes(variant_dir(family, "dora")))
        assert sum(n.endswith("lora_magnitude_vector") for n in names) == 4
        names = list(tensor_shapes(variant_dir(family, "embedding_lora")))
        assert any("embed_tokens.lora_embedding_A" in n for n in names)
        assert any("lm_head.lora_A" in n for n in names)
        names = list(tensor_shapes(variant_dir(family, "modules_to_save_lm_head")))
        assert "base_model.model.lm_head.weight" in names


def decided(client, url: str):
    """The version's body once validation and the quality gate have both decided."""
    body = client.get(url).json()
    if body["status"] == "rejected" or body["quality"] in ("passed", "degraded", "failed"):
        return body
    return None


@pytest.mark.parametrize("family", VARIANT_FAMILIES)
def test_every_variant_uploaded_through_the_api_ends_ready_through_the_worker(
    family, s3_worker, tenant_a, make_key, key_client, family_base_dir, variant_dir, settings
):
    base = import_family(family, family_base_dir(family))
    client = key_client(make_key(tenant_a)[1])
    urls = {}
    for variant in VARIANTS:
        name = variant.replace("_", "-")
        created = client.post(
            "/api/v1/adapters/", {"name": name, "base_model": base}, format="json"
        )
        assert created.status_code == 201, created.json()
        response = upload(client, name, variant_dir(family, variant))
        assert response.status_code == 202, response.json()
        urls[variant] = response.json()["url"]

    finals = {
        variant: wait_for(lambda url=url: decided(client, url), what=f"validation of {variant}")
        for variant, url in urls.items()
    }
    refused = {v: body["status_detail"] for v, body in finals.items() if body["status"] != "ready"}
    assert not refused, refused
    for variant, body in finals.items():
        assert body["compatible"] is True, (variant, body["compatibility_detail"])
        failed = [c for c in body["report"] if not c["passed"] and c["level"] == "error"]
        assert not failed, (variant, failed)
        assert body["target_modules"], variant
        # no eval set anywhere: the gate passes it unmeasured, as any first upload
        assert body["quality"] == "passed", (variant, body["quality_detail"])
    adapted = set(finals["embedding_lora"]["target_modules"])
    assert {"embed_tokens", "lm_head"} <= adapted, adapted
    # r is 4, one module's pattern 8: the version shows the largest, what a slot must hold
    assert finals["rank_pattern"]["rank"] == 8

    # Staged into the adapter cache like any other: both files, sha256-verified.
    for body in finals.values():
        row = AdapterVersion.objects.get(adapter__name=body["adapter"], number=body["number"])
        folder = settings.ADAPTER_CACHE_DIR / row.uid.hex
        wait_for(lambda f=folder: (f / "adapter_model.safetensors").exists(), what="staging")
        assert sha256_of(folder / "adapter_model.safetensors") == body["weights_sha256"]


@pytest.mark.django_db
@pytest.mark.parametrize("family", ["llama", "phi3"])
def test_every_variant_fits_a_new_revision_of_its_base(
    family, tenant_a, family_base_dir, variant_dir, tmp_path
):
    """A base re-import re-checks each version's header against the new weights: the
    variants' extra tensors (magnitudes, embedding factors, saved heads) still fit."""
    from registry.services.adapters import adapter_create

    base = import_family(family, family_base_dir(family))
    versions = []
    for variant in VARIANTS:
        adapter = adapter_create(
            tenant=tenant_a, name=variant.replace("_", "-"), actor="test", base_model_name=base
        )
        versions.append(make_ready_version(adapter, variant_dir(family, variant)))
    retrained = make_tiny_model(tmp_path / "retrained", family, seed=1)
    row, changed = base_model_import(name=base, path=retrained)
    assert changed
    counts = base_model_recheck(base_model_id=row.pk)
    details = {}
    for version in versions:
        version.refresh_from_db()
        details[version.adapter.name] = version.compatibility_detail
        assert version.checked_revision == row.revision
    assert counts == {"compatible": len(VARIANTS), "incompatible": 0}, details
