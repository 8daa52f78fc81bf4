"""The engine's forward pass against transformers' LlamaForCausalLM on the same weights."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from inference.engine import EngineRequest, LLMEngine, SamplingParams
from tests.engine.stepping import step_logits
from tests.tiny_llama import make_tiny_llama

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
VARIANTS = {
    "gqa_tied": {},
    "untied": {"tie": False},
    "mha": {"heads": 4, "kv_heads": 4},
    "llama3_rope": {"rope_scaling": LLAMA3_ROPE, "rope_theta": 500000.0},
    "linear_rope": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    "mistral": {"architecture": "MistralForCausalLM", "kv_heads": 1},
    "padded_vocab": {"vocab": 400},
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def model_dir(request, tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp(request.param), **VARIANTS[request.param])


def _hf_next_logits(hf, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([token_ids])).logits[0, -1]


@pytest.mark.parametrize("decode_kv", ["buffered", "gathered"])
def test_prefill_and_decode_logits_match_transformers(model_dir, decode_kv):
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    engine = LLMEngine(model=model_dir, block_size=4, kv_cache_bytes=1 << 20)
    inputs = engine.model_runner.input_builder
    if decode_kv == "buffered":
        inputs.decode_buffers.headroom = 2  # buffers grow every few steps, appended between
    else:
        inputs.decode_buffers.budget_bytes = 0  # gathered from the paged cache every step
    vocab = engine.config.model_config.vocab_size
    # Different lengths in one batch; 70 tokens cross many blocks and pass the llama3
    # original context of 32, where the scaled frequencies matter.
    prompts = [torch.randint(3, 384, (n,)).tolist() for n in (1, 5, 13, 70)]
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(EngineRequest(f"r{i}", prompt_token_ids=ids, sampling_params=params))
    for _ in range(6):
        rows = step_logits(engine)
        assert len(rows) == len(prompts)
        for seq, row in rows:
            assert row.shape == (vocab,)
            expected = _hf_next_logits(hf, seq.token_ids)
            torch.testing.assert_close(row, expected, atol=1e-4, rtol=0)
            seq.token_ids.append(int(expected.argmax()))


def test_generation_matches_transformers_greedy(model_dir):
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    engine = LLMEngine(model=model_dir, kv_cache_bytes=1 << 20)
    prompt = engine.tokenizer.encode("The quick brown fox jumps")
    [out] = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    expected = hf.generate(
        torch.tensor([prompt]),
        max_new_tokens=24,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )[0, len(prompt) :].tolist()
    assert out.token_ids == expected
    assert out.finish_reason == "length"
