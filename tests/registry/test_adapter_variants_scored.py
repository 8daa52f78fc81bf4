"""The quality gate scores every PEFT LoRA variant on a live engine (`serve`) as it scores
any adapter: each is uploaded through the REST API with an eval set, the real worker validates
it, then scores it on the engine, and its evaluation passes with the figures transformers +
PEFT compute for the same rows.
"""

import pytest

from registry.models import AdapterVersion
from tests.registry.conftest import files_of
from tests.registry.peft_variants import VARIANT_FAMILIES, VARIANTS, import_family
from tests.waiting import wait_for

OPERATOR_TOKEN = "variants-operator-token"


@pytest.fixture
def live_engine(s3, settings, monkeypatch, tmp_path):
    """start(base name) -> the URL of a `serve` process for that base, on the test's bucket;
    a worker started after it (live_worker) scores on it."""
    from tests.inference.conftest import start_server, stop_server

    procs = []

    def start(base: str, **env: str) -> str:
        settings.OPERATOR_TOKEN = OPERATOR_TOKEN
        url, proc, _ = start_server(
            tmp_path,
            {"LORAPLEX_OPERATOR_TOKEN": OPERATOR_TOKEN, "LORAPLEX_BASE_MODEL": base, **env},
            name=f"serve-{base}",
        )
        procs.append(proc)
        settings.ENGINE_URLS = [url]
        monkeypatch.setenv("LORAPLEX_ENGINE_URLS", url)
        monkeypatch.setenv("LORAPLEX_OPERATOR_TOKEN", OPERATOR_TOKEN)
        return url

    yield start
    for proc in procs:
        stop_server(proc)


@pytest.mark.parametrize("family", VARIANT_FAMILIES)
def test_the_quality_gate_scores_every_variant_on_the_engine_as_peft_does(
    family,
    request,
    transactional_db,
    live_engine,
    tenant_a,
    make_key,
    key_client,
    family_base_dir,
    variant_dir,
):
    """Each variant is uploaded with an eval set; the worker validates it, then scores it on
    the engine: its evaluation passes with the figures transformers + PEFT compute."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from tests.trained_adapter import eval_set_jsonl, reference_nll, task_rows

    base_dir = family_base_dir(family)
    base = import_family(family, base_dir)
    # An engine whose sequences may pass Phi-3's original 32 positions uses LongRoPE's long
    # factors throughout (as vLLM does); transformers uses the short ones for short rows.
    live_engine(base, **({"LORAPLEX_MAX_MODEL_LEN": "32"} if family == "phi3" else {}))
    request.getfixturevalue("live_worker")  # started after the environment names the engine
    rows = task_rows(eval_n=4).eval
    client = key_client(make_key(tenant_a)[1])
    for variant in VARIANTS:
        name = variant.replace("_", "-")
        client.post("/api/v1/adapters/", {"name": name, "base_model": base}, format="json")
        body = files_of(variant_dir(family, variant)) | {
            "eval": SimpleUploadedFile("eval.jsonl", eval_set_jsonl(rows))
        }
        response = client.post(f"/api/v1/adapters/{name}/versions/", body, format="multipart")
        assert response.status_code == 202, response.json()

    def evaluated():
        versions = list(AdapterVersion.objects.filter(adapter__tenant=tenant_a))
        done = [
            v
            for v in versions
            if v.status == "rejected" or v.quality in ("passed", "degraded", "failed")
        ]
        return versions if len(done) == len(VARIANTS) else None

    versions = wait_for(evaluated, timeout=180, what="the worker's evaluations")
    expected_base = reference_nll(base_dir, None, rows)
    errors = {}
    for version in versions:
        variant = version.adapter.name.replace("-", "_")
        assert version.status == "ready", (variant, version.status_detail)
        assert version.quality == "passed", (variant, version.quality_detail)
        evaluation = version.evaluations.get()
        expected = reference_nll(base_dir, variant_dir(family, variant), rows)
        assert evaluation.adapter_tokens == expected["tokens"] == evaluation.base_tokens
        errors[variant] = abs(evaluation.adapter_nll - expected["nll"])
        assert evaluation.base_nll == pytest.approx(expected_base["nll"], abs=1e-5)
        # the adapter changes the figure far more than the engine may differ from PEFT
        assert abs(evaluation.adapter_nll - evaluation.base_nll) > 1e-4, variant
    print(f"{family}: |engine - PEFT| mean NLL per token by variant: {errors}")
    # Without its variant's own part (the DoRA magnitudes, the embedding factors, the saved
    # head, the alpha pattern), each adapter's figure moves by 7e-3 or more on the tiny Llama:
    # an engine that skipped the part would miss this by far.
    assert max(errors.values()) < 1e-5, errors
