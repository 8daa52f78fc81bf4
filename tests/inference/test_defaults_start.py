"""`manage.py serve` starts with nothing configured: the defaults hold each other.

Before, the default CPU memory budget (512 MiB) could not hold the default 8 adapter slots
at rank 64 (631 MB for SmolLM2), so `serve` exited on a fresh machine (the README's native
commands and the compose `engine` service); only `make run` set a bigger budget. Now the
budget is sized from the model: the slots plus 512 MiB of KV cache
(inference/engine/kv_cache.py).
"""

import json
import os
import subprocess
import sys

import pytest

from inference.engine import EngineConfig
from inference.engine.kv_cache import CPU_DEFAULT_KV_BYTES, default_kv_bytes
from tests.clients import chat
from tests.inference.conftest import stop_server
from tests.processes import ROOT, launch
from tests.smollm2 import PRESET, smollm2_dir

# What `make run` does before `serve`, in one process: migrate, import, a demo key.
SETUP = """
import os
os.environ["DJANGO_SETTINGS_MODULE"] = "platform_site.settings"
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
call_command("import_base_model", preset="smollm2-135m-instruct")
call_command("bootstrap_demo")
"""


@pytest.mark.slow
def test_serve_starts_and_answers_with_an_empty_environment(tmp_path):
    var = tmp_path / "var"
    (var / "models").mkdir(parents=True)
    (var / "models" / PRESET).symlink_to(smollm2_dir())  # converted once per checkout
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LORAPLEX_VAR_DIR": str(var)}
    setup = subprocess.run(
        [sys.executable, "-c", SETUP],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert setup.returncode == 0, setup.stderr
    key = setup.stdout.strip().splitlines()[-1]
    assert key.startswith("lpx_")
    # before: `serve` exited here, its default budget too small for the adapter slots
    url, proc, _ = launch(tmp_path, env, timeout=300)
    try:
        france = [{"role": "user", "content": "What is the capital of France?"}]
        answer = chat(url, key, model=PRESET, messages=france, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]
    finally:
        stop_server(proc)


def test_the_default_cache_holds_at_least_one_whole_sequence(tmp_path):
    """512 MiB, unless one sequence of the model's context needs more (an 8B model at 32k)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    long = EngineConfig(model=tmp_path, device="cpu")
    per_token = 2 * 32 * 8 * 128 * 4  # keys and values, every layer, fp32
    assert default_kv_bytes(long) == 32768 * per_token > CPU_DEFAULT_KV_BYTES
    short = EngineConfig(model=tmp_path, device="cpu", max_model_len=1024)
    assert default_kv_bytes(short) == CPU_DEFAULT_KV_BYTES
