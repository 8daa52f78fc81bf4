"""The engine on the real bundled model, against transformers on the same folder."""

import pytest
import torch

from inference.engine import LLMEngine, SamplingParams
from tests.smollm2 import smollm2_dir

pytestmark = pytest.mark.slow


def test_chat_greedy_32_tokens_equal_transformers():
    from transformers import AutoModelForCausalLM

    folder = smollm2_dir()
    engine = LLMEngine(model=folder, kv_cache_bytes=64 << 20)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt_ids = engine.tokenizer.encode(engine.tokenizer.apply_chat_template(messages))
    [ours] = engine.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=32))

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([prompt_ids]), max_new_tokens=32, do_sample=False)
    assert ours.token_ids == theirs[0, len(prompt_ids) :].tolist()
    assert "Paris" in ours.text
