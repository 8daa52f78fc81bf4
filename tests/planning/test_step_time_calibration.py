"""The step-time model against the published step times docs/cost_model.md tabulates: the
rows where the engine's host work is out of the figure stay within 10%."""

import pytest

from inference.engine.planning import PRESETS, device_named, model_config
from inference.engine.planning.step_time import StepShape, StepTimeModel

LLAMA_3_70B = model_config(PRESETS["llama-3-70b"])


def llama_2(**dims):
    raw = {**PRESETS["llama-3-70b"], "vocab_size": 32000, "max_position_embeddings": 4096}
    raw.update(rope_theta=10000.0, bos_token_id=1, eos_token_id=2)
    return model_config({**raw, **dims})


LLAMA_2_70B = llama_2()
LLAMA_2_7B = llama_2(
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=32,
)


def generation_seconds(m: StepTimeModel, batch: int, prompt: int, output: int) -> list[float]:
    """A static batch: one prefill step, then a decode step per further output token."""
    steps = [m.step_seconds(StepShape(prefills=((0, prompt),) * batch))]
    for k in range(1, output):
        steps.append(m.step_seconds(StepShape(decode_contexts=(prompt + k,) * batch)))
    return steps


@pytest.mark.parametrize(("prompt", "output", "itl_ms"), [(5000, 500, 18.58), (500, 2000, 18.91)])
def test_nim_70b_fp8_tp2_h100_inter_token_latency_at_concurrency_1(prompt, output, itl_ms):
    m = StepTimeModel(LLAMA_3_70B, device_named("h100"), "fp8", 2)
    decode = generation_seconds(m, 1, prompt, output)[1:]
    assert 1000 * sum(decode) / len(decode) == pytest.approx(itl_ms, rel=0.10)


def test_tensorrt_llm_llama_2_7b_a100_static_batch_throughput():
    m = StepTimeModel(LLAMA_2_7B, device_named("a100-80g"), "bf16")
    tokens_per_s = 60 * 2048 / sum(generation_seconds(m, 60, 128, 2048))
    assert tokens_per_s == pytest.approx(1928, rel=0.10)


@pytest.mark.parametrize(
    ("mc", "tp", "first_token_ms"), [(LLAMA_2_7B, 1, 133), (LLAMA_2_70B, 4, 377)]
)
def test_tensorrt_llm_a100_first_token_of_a_2048_token_prompt(mc, tp, first_token_ms):
    m = StepTimeModel(mc, device_named("a100-80g"), "bf16", tp)
    assert m.prefill_ms(2048) == pytest.approx(first_token_ms, rel=0.10)
