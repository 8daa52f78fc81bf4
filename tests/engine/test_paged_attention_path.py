"""The engine on the Triton paged-attention kernels (run by Triton's interpreter on CPU)
against transformers, as the torch path is in test_model_families.py: the kernels read the
paged cache in place, with GQA, sliding windows (and the blocks released behind them),
soft-capping, chunked prefill over a cached prefix and the prefix cache."""

import pytest
import torch

from inference.engine import LLMEngine
from inference.engine.errors import ConfigError
from tests.engine.test_model_families import PROMPT_LENGTHS, _compare_steps, _hf
from tests.tiny_models import make_tiny_model

FAMILIES = ["llama", "mistral", "qwen3", "gemma2", "phi3"]


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request, tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp(request.param), request.param)


@pytest.mark.parametrize("chunked", [False, True])
def test_paged_kernels_match_transformers(family_dir, chunked):
    kwargs = {"max_num_batched_tokens": 7, "max_num_seqs": 4} if chunked else {}
    engine = LLMEngine(
        model=family_dir,
        block_size=4,
        kv_cache_bytes=1 << 20,
        attention_backend="triton",
        **kwargs,
    )
    assert engine.model_runner.paged
    torch.manual_seed(1)
    prompts = [torch.randint(3, 384, (n,)).tolist() for n in PROMPT_LENGTHS]
    assert _compare_steps(engine, _hf(family_dir), prompts, 4) < 1e-4


def test_a_cached_prefix_is_read_in_place(tmp_path):
    folder = make_tiny_model(tmp_path, "gemma2")
    hf = _hf(folder)
    engine = LLMEngine(
        model=folder, block_size=4, kv_cache_bytes=1 << 20, attention_backend="triton"
    )
    shared = list(range(10, 26))
    _compare_steps(engine, hf, [shared + [5]], 2)
    hits = engine.block_manager.stats.hits
    _compare_steps(engine, hf, [shared + [7, 8]], 2, tag="again")
    assert engine.block_manager.stats.hits > hits


def test_the_torch_path_stays_the_cpu_default(tmp_path):
    folder = make_tiny_model(tmp_path, "llama")
    assert not LLMEngine(model=folder, kv_cache_bytes=1 << 20).model_runner.paged


@pytest.mark.parametrize("value", ["flash", None])
def test_an_unknown_attention_backend_is_refused(tmp_path, value):
    folder = make_tiny_model(tmp_path, "llama")
    with pytest.raises(ConfigError, match="is not a kernel backend"):
        LLMEngine(model=folder, kv_cache_bytes=1 << 20, attention_backend=value)


def test_triton_on_cpu_needs_the_interpreter(tmp_path, monkeypatch):
    folder = make_tiny_model(tmp_path, "llama")
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ConfigError, match="needs TRITON_INTERPRET=1"):
        LLMEngine(model=folder, kv_cache_bytes=1 << 20, attention_backend="triton")
