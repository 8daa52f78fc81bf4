"""The capacity planner's arithmetic, checked against figures worked out by hand."""

import pytest

from inference.engine.planning import PRESETS, PlanError, PlanRequest, device_named, plan
from inference.engine.planning.traffic import simulate, zipf_weights

H200 = device_named("h200")


def planned(model: str, **kwargs):
    kwargs.setdefault("device", H200)
    return plan(PlanRequest(config=PRESETS[model], name=model, **kwargs))


def test_llama_3_8b_in_bf16_weighs_what_its_parameters_do():
    hidden, inter, layers, vocab, kv = 4096, 14336, 32, 128256, 8 * 128
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter + 2 * hidden
    params = 2 * vocab * hidden + layers * per_layer + hidden  # untied head, final norm
    p = planned("llama-3-8b", quantization="bf16")
    assert p.weights_bytes_per_gpu == 2 * params == 16_060_522_496


def test_llama_3_70b_kv_bytes_per_token_and_its_shards():
    assert planned("llama-3-70b", quantization="fp8").kv_bytes_per_token_per_gpu == 327_680
    two = planned("llama-3-70b", quantization="fp8", tp=2).to_dict()
    assert two["kv_bytes_per_token_per_gpu"] == 163_840 and two["kv_bytes_per_token"] == 327_680
    # 16 ranks, 8 KV heads: each rank keeps a copy of one head, so all ranks hold twice the model's
    sixteen = planned("llama-3-70b", quantization="fp8", tp=16, suggest=False)
    assert sixteen.kv_bytes_per_token_per_gpu == 80 * 1 * 128 * 2 * 2


def test_adapter_bytes_are_the_slot_row_and_the_targets_own_factors():
    p = planned("llama-3-70b", quantization="fp8", rank=16, targets=("q_proj", "v_proj"))
    h, q, kv, i = 8192, 8192, 1024, 28672
    row = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
    assert p.adapter_bytes_per_gpu == 80 * 16 * row * 2 == 414_187_520
    assert p.adapter_weights_bytes_per_gpu == 80 * 16 * ((h + q) + (h + kv)) * 2


def test_fp8_70b_fits_one_h200_and_bf16_does_not():
    fp8 = planned("llama-3-70b", quantization="fp8", tenants=100)
    assert fp8.fits and fp8.device_slots >= 1 and fp8.max_batch >= fp8.concurrency
    assert fp8.settings["LORAPLEX_MAX_LORAS"] == fp8.device_slots
    assert 70e9 < fp8.weights_bytes_per_gpu < 75e9  # 8-bit linears, 16-bit embeddings and head
    bf16 = planned("llama-3-70b", quantization="bf16")
    assert not bf16.fits and bf16.kv_blocks == 0 and bf16.settings == {}
    assert "--quantization fp8" in bf16.reason and "--tp 2" in bf16.reason
    assert {(s["tp"], s["quantization"]) for s in bf16.suggestions} == {(2, "bf16"), (1, "fp8")}


def test_stronger_quantization_weighs_less_and_leaves_more_kv():
    plans = [planned("llama-3-70b", quantization=q) for q in ("fp8", "w8a16", "w4a16")]
    assert plans[0].weights_bytes_per_gpu > plans[2].weights_bytes_per_gpu
    assert plans[0].kv_tokens < plans[2].kv_tokens
    w4 = plans[2].weights_bytes_per_gpu
    assert 35e9 < w4 < 42e9  # 4 bits a weight, a 16-bit scale per 128, 16-bit embeddings


def test_tensor_parallel_splits_weights_and_refuses_what_heads_do_not_divide():
    one, two = (
        planned("llama-3-70b", quantization="fp8"),
        planned("llama-3-70b", quantization="fp8", tp=2),
    )
    assert (
        abs(2 * two.weights_bytes_per_gpu - one.weights_bytes_per_gpu)
        < 0.01 * one.weights_bytes_per_gpu
    )
    assert two.kv_tokens > 2 * one.kv_tokens
    with pytest.raises(PlanError, match="tensor_parallel_size 3 does not divide"):
        planned("llama-3-70b", tp=3)
    with pytest.raises(PlanError, match="28 attention heads"):
        planned("qwen2.5-7b", tp=8)


@pytest.mark.parametrize("model", sorted(PRESETS))
def test_every_preset_plans_on_an_h200(model):
    p = planned(model, quantization="fp8", tp=8 if model == "llama-3.1-405b" else 1)
    assert p.fits, p.reason


def test_unknown_targets_and_bad_lengths_are_refused():
    with pytest.raises(PlanError, match="unknown target module lm_proj"):
        planned("llama-3-8b", targets=("q_proj", "lm_proj"))
    with pytest.raises(PlanError, match="exceed the model's context"):
        planned("llama-3-8b", prompt_tokens=8000, output_tokens=1000)


def test_zipf_hit_rates_grow_with_the_slots():
    weights = zipf_weights(100, 1.1)
    device = [simulate(weights, n, 100).device for n in (1, 2, 4, 8, 16, 32, 64, 100)]
    assert device == sorted(device) and device[0] < 0.3 and device[-1] == 1.0
    served = [1 - simulate(weights, 4, m).disk for m in (4, 8, 16, 32, 64)]
    assert served == sorted(served) and served[0] < served[-1]
    flat, skewed = simulate(zipf_weights(100, 0.0), 16, 16), simulate(weights, 16, 16)
    assert flat.device < skewed.device
    rates = simulate(weights, 8, 32)
    assert rates.device + rates.host + rates.disk == pytest.approx(1.0)
