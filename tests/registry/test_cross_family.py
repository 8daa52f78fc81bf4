"""An adapter trained on one family never passes for another family's base: uploaded through
the REST API (the real worker validates it) it is rejected, and the version's report says what
does not fit; the same holds for every pair at header level, and for a base re-imported under
its name from another family's checkpoint (the compatibility re-check).

The tiny models give each family its own shapes, as real checkpoints have (Llama and Mistral
share a hidden size and differ in KV heads; Phi-3 fuses q/k/v and gate/up), and each adapter
names the base it was trained on (`tiny-<family>`).
"""

from pathlib import Path

import pytest
from django.core.management import call_command

from registry.models import AdapterVersion
from registry.services.base_models import base_model_import, base_model_recheck, read_model_folder
from registry.validation import validate_adapter_files
from tests.peft_adapters import make_peft_adapter
from tests.registry.conftest import make_ready_version, targets_of, upload
from tests.tiny_models import FAMILIES
from tests.waiting import wait_for

ORDER = tuple(FAMILIES)  # llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3
# each family's adapter goes to the next family's base: every family once on each side
RING = [(ORDER[i], ORDER[(i + 1) % len(ORDER)]) for i in range(len(ORDER))]
PAIRS = [(a, b) for a in ORDER for b in ORDER]


@pytest.fixture(scope="module")
def family_adapter_dir(family_base_dir, tmp_path_factory):
    """family_adapter_dir(family) -> a PEFT adapter on all of its projections, made once."""
    made: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in made:
            made[family] = make_peft_adapter(
                family_base_dir(family),
                tmp_path_factory.mktemp(f"adapter-{family}"),
                rank=4,
                alpha=8,
                targets=targets_of(family),
                base_model_name=f"tiny-{family}",
            )
        return made[family]

    return get


def assert_names_the_mismatch(detail: str, report: list[dict], adapter: str, base: str, fps):
    """What a person needs to see why: the base's architecture, what differs, and which base
    the adapter says it was trained on."""
    fa, fb = fps[adapter], fps[base]
    assert fb.architecture in detail, detail
    if fa.hidden != fb.hidden:
        assert "hidden" in detail and str(fa.hidden) in detail and str(fb.hidden) in detail, detail
    missing = sorted(set(fa.modules) - set(fb.modules))
    if missing:  # Phi-3's fused names on another base, or the other way round
        assert any(m in detail for m in missing), detail
    elif fa.kv_heads != fb.kv_heads:
        assert "k_proj" in detail or "v_proj" in detail, detail
    claimed = next(c for c in report if c["name"] == "base_model")
    assert f"tiny-{adapter}" in claimed["message"] and not claimed["passed"], claimed


@pytest.fixture(scope="module")
def fingerprints(family_base_dir):
    return {family: read_model_folder(family_base_dir(family))[0] for family in ORDER}


@pytest.mark.parametrize("adapter, base", PAIRS, ids=[f"{a}-on-{b}" for a, b in PAIRS])
def test_each_pair_of_families_at_header_level(adapter, base, family_adapter_dir, fingerprints):
    folder = family_adapter_dir(adapter)
    result = validate_adapter_files(
        folder / "adapter_config.json",
        folder / "adapter_model.safetensors",
        fingerprint=fingerprints[base],
        max_lora_rank=64,
        max_config_bytes=1 << 20,
        max_weights_bytes=1 << 30,
        base_model_name=f"tiny-{base}",
        check_values=False,
    )
    if adapter == base:
        assert result.ok, result.summary()
        return
    assert not result.ok
    assert_names_the_mismatch(result.summary(), result.report(), adapter, base, fingerprints)


def test_each_familys_adapter_uploaded_for_another_familys_base_is_rejected(
    s3_worker, tenant_a, make_key, key_client, family_base_dir, family_adapter_dir, fingerprints
):
    for family in ORDER:
        call_command(
            "import_base_model",
            "--hf-dir",
            str(family_base_dir(family)),
            "--name",
            f"tiny-{family}",
        )
    client = key_client(make_key(tenant_a)[1])
    urls = {}
    for adapter, base in RING:
        name = f"{adapter}-on-{base}"
        created = client.post(
            "/api/v1/adapters/", {"name": name, "base_model": f"tiny-{base}"}, format="json"
        )
        assert created.status_code == 201, created.json()
        response = upload(client, name, family_adapter_dir(adapter))
        assert response.status_code == 202, response.json()
        urls[(adapter, base)] = response.json()["url"]

    def decided(url):
        body = client.get(url).json()
        return body if body["status"] in ("ready", "rejected") else None

    for (adapter, base), url in urls.items():
        body = wait_for(lambda url=url: decided(url), what=f"validation of {adapter} on {base}")
        assert body["status"] == "rejected", (adapter, base, body["status_detail"])
        assert body["compatible"] is False
        assert body["compatibility_detail"] == body["status_detail"]
        assert_names_the_mismatch(
            body["status_detail"], body["report"], adapter, base, fingerprints
        )


@pytest.mark.django_db
@pytest.mark.parametrize("old, new", [("llama", "qwen2"), ("qwen3", "phi3"), ("phi3", "gemma3")])
def test_a_base_reimported_from_another_family_fails_the_recheck_naming_why(
    old, new, tenant_a, family_base_dir, family_adapter_dir, fingerprints
):
    from registry.services.adapters import adapter_create

    name = "tiny-base"
    base_model_import(name=name, path=family_base_dir(old), default=True)
    adapter = adapter_create(tenant=tenant_a, name="bot", actor="test", base_model_name=name)
    version = make_ready_version(adapter, family_adapter_dir(old))
    row, changed = base_model_import(name=name, path=family_base_dir(new))
    assert changed and row.fingerprint["architecture"] == fingerprints[new].architecture

    assert base_model_recheck(base_model_id=row.pk) == {"compatible": 0, "incompatible": 1}
    version = AdapterVersion.objects.get(pk=version.pk)
    assert version.status == "ready" and version.compatible is False
    assert version.checked_revision == row.revision
    assert fingerprints[new].architecture in version.compatibility_detail
    assert version.quality == "failed" and "does not fit" in version.quality_detail
