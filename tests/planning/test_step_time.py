"""The step-time model behaves as a roofline must: bytes bound a small decode, FLOPs a
prefill, and quantization, tensor parallelism and adapters move it the way they should."""

import pytest

from inference.engine.planning import PRESETS, device_named, model_config
from inference.engine.planning.step_time import (
    LAYER_FLOOR_S,
    RATES,
    STEP_FLOOR_S,
    STREAM_EFFICIENCY,
    StepShape,
    StepTimeModel,
)

LLAMA_8B = model_config(PRESETS["llama-3-8b"])
LLAMA_70B = model_config(PRESETS["llama-3-70b"])
H100 = device_named("h100")


def model(mc=LLAMA_8B, device=H100, **kwargs) -> StepTimeModel:
    return StepTimeModel(mc, device, **kwargs)


def test_an_8b_bf16_decode_at_batch_1_is_its_weights_over_hbm_bandwidth_plus_a_floor():
    m = model()
    weights_and_head = 16.06e9 - 128256 * 4096 * 2  # all but the embedding, read each step
    copy_bound = weights_and_head / RATES["h100"].hbm_bandwidth * 1000  # about 5.2 ms
    bound = copy_bound / STREAM_EFFICIENCY  # what skinny GEMMs reach of it
    step = m.decode_step_ms(1, 1024)
    assert bound < step < bound + 1.5
    assert 5.5 < step < 8.5


def test_decode_time_grows_with_batch_and_context():
    m = model()
    by_batch = [m.decode_step_ms(b, 2048) for b in (1, 8, 64, 256)]
    assert by_batch == sorted(by_batch) and by_batch[-1] > 2 * by_batch[0]
    by_context = [m.decode_step_ms(64, c) for c in (128, 1024, 8192)]
    assert by_context == sorted(by_context) and by_context[-1] > 2 * by_context[0]
    # memory-bound at small batch: eight sequences of short context cost little over one
    assert m.decode_step_ms(8, 128) < 1.05 * m.decode_step_ms(1, 128)


def test_fp8_halves_the_weights_time():
    bf16, fp8 = model(quantization="bf16"), model(quantization="fp8")
    assert fp8.weight_bytes == bf16.weight_bytes / 2
    saved = bf16.decode_step_ms(1, 16) - fp8.decode_step_ms(1, 16)
    half_weights = bf16.weight_bytes / 2 / bf16.weight_bandwidth * 1000
    assert saved == pytest.approx(half_weights, rel=1e-6)
    assert fp8.prefill_ms(1024) < 0.7 * bf16.prefill_ms(1024)  # FP8 tensor cores


def test_tensor_parallel_halves_each_ranks_weights_and_adds_all_reduces():
    one, two = model(LLAMA_70B, quantization="fp8"), model(LLAMA_70B, quantization="fp8",
                                                           tensor_parallel_size=2)  # fmt: skip
    assert two.weight_bytes == one.weight_bytes / 2
    shape = StepShape(decode_contexts=(1024,) * 32)
    floor = 80 * LAYER_FLOOR_S + STEP_FLOOR_S
    all_reduces = two._allreduce_seconds(32)
    # every byte and FLOP of a rank halves; the all-reduces come on top
    halved = (one.step_seconds(shape) - floor) / 2
    assert two.step_seconds(shape) - floor - all_reduces == pytest.approx(halved, rel=1e-9)
    assert two.step_seconds(shape) < one.step_seconds(shape)
    assert two._allreduce_seconds(32) > 2 * 80 * RATES["h100"].allreduce_latency_s
    assert two._allreduce_seconds(4096) > two._allreduce_seconds(32)
    assert one._allreduce_seconds(4096) == 0


def test_lora_adds_time_growing_with_distinct_adapters():
    m = model()
    contexts = (1024,) * 64

    def step(adapters: int) -> float:
        ranks = (16,) * adapters
        return m.step_seconds(StepShape(decode_contexts=contexts, lora_ranks=ranks,
                                        lora_tokens=64 if adapters else 0))  # fmt: skip

    times = [step(n) for n in (0, 1, 8, 32, 64)]
    assert times == sorted(times) and len(set(times)) == len(times)
    higher_rank = StepShape(decode_contexts=contexts, lora_ranks=(64,) * 8, lora_tokens=64)
    assert m.step_seconds(higher_rank) > step(8)
    fewer_targets = model(lora_targets=("q_proj", "v_proj"))
    shape = StepShape(decode_contexts=contexts, lora_ranks=(16,) * 8, lora_tokens=64)
    assert fewer_targets.step_seconds(shape) < m.step_seconds(shape)


def test_a_1k_prefill_is_compute_bound():
    m = model()
    flops = 2 * 1024 * m.mc.num_layers * m.layer_params
    compute_ms = flops / RATES["h100"].bf16_flops * 1000
    memory_ms = m.weight_bytes / m.weight_bandwidth * 1000
    assert compute_ms > memory_ms
    assert compute_ms < m.prefill_ms(1024) < 1.5 * compute_ms
    # a chunk late in a long prompt attends over more and costs more than the first
    late = m.step_seconds(StepShape(prefills=((7168, 1024),)))
    assert late > m.step_seconds(StepShape(prefills=((0, 1024),)))


def test_a_faster_memory_decodes_faster():
    h100, h200 = model(LLAMA_70B, quantization="fp8"), model(LLAMA_70B,
                                                            device=device_named("h200"),
                                                            quantization="fp8")  # fmt: skip
    assert h200.decode_step_ms(1, 1024) < h100.decode_step_ms(1, 1024)


def test_copy_seconds_is_bytes_over_the_host_link():
    m = model()
    assert m.copy_seconds(55_000_000) == pytest.approx(55e6 / H100.host_link_bandwidth)
    assert m.copy_seconds(0) == 0


def test_an_empty_step_takes_no_time_and_tokens_count_prefill_and_decode():
    assert model().step_seconds(StepShape()) == 0
    assert StepShape(prefills=((0, 100), (50, 7)), decode_contexts=(3, 4)).tokens == 109


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prefills": ((0, -5),)}, "fed tokens >= 1"),
        ({"prefills": ((-1, 5),)}, "computed tokens >= 0"),
        ({"decode_contexts": (0,)}, "decode contexts must be >= 1"),
        ({"lora_ranks": (0,)}, "ranks must be >= 1"),
        ({"decode_contexts": (5,), "lora_ranks": (8,), "lora_tokens": 2}, "lora_tokens"),
        ({"decode_contexts": (5,), "lora_tokens": 1}, "without the adapters' ranks"),
    ],
)
def test_a_bad_step_shape_is_a_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StepShape(**kwargs)


def test_bad_model_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1"):
        model(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="unknown LoRA target"):
        model(lora_targets=("lm_head",))
    with pytest.raises(ValueError, match="no achieved rates for device 'cpu'"):
        model(device=device_named("cpu", 1 << 30))
    with pytest.raises(ValueError, match="unknown quantization"):
        model(quantization="int3")
    m = model()
    for call in (lambda: m.decode_step_ms(0, 10), lambda: m.decode_step_ms(1, -1),
                 lambda: m.prefill_ms(-3), lambda: m.copy_seconds(-1)):  # fmt: skip
        with pytest.raises(ValueError, match=">= "):
            call()
