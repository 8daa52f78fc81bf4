"""EleutherAI's lm-evaluation-harness scores an adapter through this server as it scores it
on its own: its `local-completions` model (the loglikelihoods of a multiple-choice task, sent
as batches of token ids with `echo: true, logprobs: 1, max_tokens: 1`) and its
`local-chat-completions` model (a generation task, with the chat template) give the same
metrics, per document the same loglikelihoods and the same answers, as its `hf` model with
`peft=` the adapter's folder, on the same files and the same model.

The harness runs offline in a process of its own (lm_eval_runs.py, its Python API), on two
tasks defined in local files (lm_eval_tasks/), against a live `manage.py serve` on SmolLM2
serving the demo French adapter (registry/demo/adapters).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from registry.demo import BASE_PRESET
from tests.inference.conftest import drop_live_rows, start_server, stop_server
from tests.processes import ROOT
from tests.smollm2 import smollm2_dir

pytestmark = [pytest.mark.slow, pytest.mark.django_db]
TASKS = Path(__file__).parent / "lm_eval_tasks"
ADAPTER = "demo-french"
ADAPTER_DIR = ROOT / "registry" / "demo" / "adapters" / ADAPTER
TENANT = "lm-eval"


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker, tmp_path_factory):
    """`serve` on SmolLM2, and a tenant's key for its `demo-french` adapter."""
    from registry.models import BaseModel
    from registry.services.adapters import adapter_create
    from registry.services.base_models import base_model_import
    from registry.services.versions import adapter_version_create, adapter_version_validate
    from tenants.services import api_key_create, tenant_create

    tmp = tmp_path_factory.mktemp("lm-eval")
    with django_db_blocker.unblock():
        previously_default = list(
            BaseModel.objects.filter(is_default=True).values_list("pk", flat=True)
        )
        base, _ = base_model_import(name=BASE_PRESET, path=smollm2_dir(), default=True)
        tenant = tenant_create(slug=TENANT, name="lm-eval")
        _, key = api_key_create(tenant=tenant, name="harness", scopes=["inference"])
        adapter = adapter_create(tenant=tenant, name=ADAPTER, actor="test")
        with (
            open(ADAPTER_DIR / "adapter_config.json", "rb") as config,
            open(ADAPTER_DIR / "adapter_model.safetensors", "rb") as weights,
        ):
            version, _ = adapter_version_create(
                adapter=adapter, config=config, weights=weights, actor="test"
            )
        version = adapter_version_validate(version_id=version.pk)
        assert version.status == "ready", version.report
    env = {
        "LORAPLEX_BASE_MODEL": BASE_PRESET,
        "LORAPLEX_MAX_LORA_RANK": "8",  # the demo adapters' rank: small LoRA slots
        "LORAPLEX_KV_CACHE_BYTES": str(64 << 20),
    }
    url, proc, _ = start_server(tmp, env)
    yield url, key
    stop_server(proc)
    with django_db_blocker.unblock():
        drop_live_rows([TENANT], base, previously_default=previously_default)


@pytest.fixture(scope="module")
def runs(server, tmp_path_factory) -> dict:
    """Each task scored through this server and by the harness's own `hf` model with the
    adapter (PEFT), offline, from the repository root (the tasks' data paths start there)."""
    url, key = server
    hf_args = f"pretrained={smollm2_dir()},peft={ADAPTER_DIR},dtype=float32"
    mc = {"tasks": ["loraplex_mc"], "batch_size": 4}  # token-id prompts, four a request
    gen = {"tasks": ["loraplex_gen"], "apply_chat_template": True}
    completions_args = (
        f"model={ADAPTER},base_url={url}/v1/completions,tokenizer_backend=huggingface,"
        f"tokenizer={smollm2_dir()}"
    )
    specs = {
        "mc_ours": {"model": "local-completions", "model_args": completions_args, **mc},
        "mc_hf": {"model": "hf", "model_args": hf_args, "device": "cpu", **mc},
        "gen_ours": {
            "model": "local-chat-completions",
            "model_args": f"model={ADAPTER},base_url={url}/v1/chat/completions",
            **gen,
        },
        "gen_hf": {"model": "hf", "model_args": hf_args, "device": "cpu", **gen},
    }
    tmp = tmp_path_factory.mktemp("lm-eval-runs")
    (tmp / "runs.json").write_text(
        json.dumps({name: {**spec, "include_path": str(TASKS)} for name, spec in specs.items()})
    )
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp / "datasets"),
        "OPENAI_API_KEY": key,  # what the harness's local-* models send as the Bearer token
        "OMP_NUM_THREADS": "1",  # one thread: on a busy machine several are far slower
        "TOKENIZERS_PARALLELISM": "false",
    }
    command = [sys.executable, "-m", "tests.inference.clients.lm_eval_runs"]
    command += [str(tmp / "runs.json"), str(tmp / "out.json")]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((tmp / "out.json").read_text())


def docs(run: dict, task: str) -> list[dict]:
    return sorted(run["samples"][task], key=lambda sample: sample["doc_id"])


def test_local_completions_scores_multiple_choice_as_hf_with_peft(runs):
    ours, theirs = runs["mc_ours"], runs["mc_hf"]
    metric = ours["results"]["loraplex_mc"]["acc,none"]
    assert metric == theirs["results"]["loraplex_mc"]["acc,none"]
    our_docs, their_docs = docs(ours, "loraplex_mc"), docs(theirs, "loraplex_mc")
    assert len(our_docs) == len(their_docs) == 6
    for mine, reference in zip(our_docs, their_docs, strict=True):
        # per choice: (the continuation's loglikelihood, whether greedy decoding gives it)
        ours_by_choice = [resp[0] for resp in mine["resps"]]
        theirs_by_choice = [resp[0] for resp in reference["resps"]]
        for (ll, greedy), (expected, expected_greedy) in zip(
            ours_by_choice, theirs_by_choice, strict=True
        ):
            assert float(ll) == pytest.approx(float(expected), abs=2e-3)
            assert greedy == expected_greedy


def test_local_chat_completions_generates_as_hf_with_peft(runs):
    ours, theirs = runs["gen_ours"], runs["gen_hf"]
    answers = [doc["filtered_resps"] for doc in docs(ours, "loraplex_gen")]
    assert answers == [doc["filtered_resps"] for doc in docs(theirs, "loraplex_gen")]
    assert all(answer[0].strip() for answer in answers)  # the adapter answered something
    metric = ours["results"]["loraplex_gen"]["exact_match,none"]
    assert metric == theirs["results"]["loraplex_gen"]["exact_match,none"]
