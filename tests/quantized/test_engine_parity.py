"""The engine serves quantized bases as transformers computes them: logits within 1e-4 in
fp32 at prefill and at decode steps, for every compressed-tensors scheme llmcompressor
wrote and for AWQ GEMM and GPTQ, without and with a PEFT adapter, and split over two
tensor-parallel ranks; the weights stay quantized in memory.

The references: transformers' decompressed model (run_compressed=False) for integer
weights; left compressed for FP8, where it also quantizes the activations as the engine
does; the same base with the checkpoint's weights dequantized by hand where transformers
cannot load the folder (asymmetric pack-quantized); the packer's fp32 dequantized twin
for AWQ and GPTQ. PEFT adapters are applied on that same reference model.

FP8 activations are rounded per token, a step function: where an activation sits nearer an
e4m3 rounding midpoint than fp32's error, the engine and transformers may round it apart
(fp8_ties.py). Such a step passes only if a float64 twin of the scheme, with that one
activation rounded the engine's way, reproduces the engine's logits within the tolerance.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from inference.engine import EngineRequest, LLMEngine, LoRARequest, SamplingParams
from inference.engine.model.quantized_linear import QuantizedLinear, weight_bytes
from inference.metrics import EngineCollector
from tests.cpu_description import cpu_description
from tests.engine.stepping import step_logits
from tests.peft_adapters import make_peft_adapter
from tests.quantized.compressed_format import dequantize_folder, load_decompressed
from tests.quantized.fp8_ties import Fp8Twin

COMPRESSED = [
    "llama-fp8-dynamic",
    "llama-fp8-static",
    "llama-w4a16",
    "llama-w4a16-asym",
    "llama-w4a16-channel",
    "llama-w4a16-g32-asym",
    "llama-w4a16-gptq-actorder",
    "llama-w8a16",
    "llama-w8a16-g64-asym",
    "qwen2-fp8-dynamic",
    "qwen2-w4a16-g64",
    "qwen2-w4a16-g64-asym",
]
PACKED = ["llama-awq-gemm-g128", "llama-gptq-g128", "llama-gptq-g128-desc-act"]
PROMPT_LENGTHS = (5, 11)
DECODE_STEPS = 3
ATOL = 1e-4
LORA = {"enable_lora": True, "max_loras": 1, "max_lora_rank": 16, "kv_cache_bytes": 4 << 20}


def _family(name: str) -> str:
    return name.split("-", 1)[0]


def _compressed_reference(compressed, name: str):
    folder = compressed.folders[name]
    if "fp8" in name:  # left compressed: activations quantized per token / by input_scale
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    if "asym" in name:  # transformers does not load these: the base, dequantized by hand
        return _hand_dequantized(folder, compressed.bases[_family(name)])
    return load_decompressed(folder)


def _fp8_twin(compressed, name: str, adapter: Path | None = None) -> Fp8Twin | None:
    """The float64 twin that judges FP8 rounding ties (None for schemes without them)."""
    if "fp8" not in name:
        return None
    return Fp8Twin(compressed.folders[name], compressed.bases[_family(name)], adapter)


def _hand_dequantized(folder: Path, base: Path):
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
    own = model.state_dict()
    stored = load_file(str(folder / "model.safetensors"))
    state = {k: v for k, v in stored.items() if k in own and v.dtype.is_floating_point}
    # rounded to the scales' dtype, as transformers decompresses (and the engine computes)
    state |= {
        f"{layer}.weight": w.to(stored[f"{layer}.weight_scale"].dtype).float()
        for layer, w in dequantize_folder(folder).items()
    }
    missing = set(own) - set(state)
    assert not {k for k in missing if "proj.weight" in k}, missing
    model.load_state_dict(state, strict=False)
    return model


def _worst_difference(
    engine: LLMEngine,
    reference,
    lora: LoRARequest | None = None,
    seed: int = 0,
    twin: Fp8Twin | None = None,
) -> float:
    """Step prompts through prefill and decode; the largest logit difference seen, but for
    the steps `twin` shows follow from an FP8 rounding tie (printed)."""
    torch.manual_seed(seed)
    params = SamplingParams(temperature=0, max_tokens=DECODE_STEPS + 1, ignore_eos=True)
    for i, n in enumerate(PROMPT_LENGTHS):
        ids = torch.randint(3, 384, (n,)).tolist()
        engine.add_request(
            EngineRequest(f"r{i}", prompt_token_ids=ids, sampling_params=params, lora_request=lora)
        )
    worst, compared = 0.0, 0
    while compared < (DECODE_STEPS + 1) * len(PROMPT_LENGTHS):
        for seq, row in step_logits(engine):
            with torch.no_grad():
                expected = reference(torch.tensor([seq.token_ids])).logits[0, -1]
            difference = float((row - expected).abs().max())
            tie = None
            if difference > ATOL and twin is not None:
                tie = twin.explain(seq.token_ids, row, ATOL)
            if tie is None:
                torch.testing.assert_close(
                    row, expected, atol=ATOL, rtol=0, msg=lambda m: f"{m}\non {cpu_description()}"
                )
                worst = max(worst, difference)
            else:
                print(
                    f"{len(seq.token_ids)} tokens: engine {difference:.1e} from transformers, {tie}"
                )
            seq.token_ids.append(int(expected.argmax()))
            compared += 1
    for i in range(len(PROMPT_LENGTHS)):
        engine.abort(f"r{i}")
    engine.step()
    return worst


def _assert_adapter_matters(peft) -> None:
    """The adapter changes the reference's logits well beyond the tolerance."""
    ids = torch.tensor([[5, 17, 42, 99]])
    with torch.no_grad():
        tuned = peft(ids).logits
        with peft.disable_adapter():
            base = peft(ids).logits
    assert float((tuned - base).abs().max()) > 100 * ATOL


def _engine(folder: Path, **kwargs) -> LLMEngine:
    kwargs.setdefault("kv_cache_bytes", 1 << 20)
    return LLMEngine(model=folder, block_size=4, **kwargs)


def _assert_resident_quantized(engine: LLMEngine) -> tuple[int, int]:
    """Every layer projection holds its quantized tensors, and no dense weight."""
    model = engine.model_runner.model
    linears = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    assert len(linears) == 4 * len(model.model.layers)
    for linear in linears:
        assert {n for n, _ in linear.named_parameters()} <= {"bias"}
        dtypes = {b.dtype for b in linear.buffers()}
        assert dtypes & {torch.int32, torch.float8_e4m3fn}, dtypes
    resident, bf16 = weight_bytes(model)
    assert resident < 4 * bf16 // 2  # below the fp32 the unquantized tensors are held in
    return resident, bf16


@pytest.mark.parametrize("name", COMPRESSED)
def test_compressed_tensors_logits_match_transformers(compressed_checkpoints, name):
    engine = _engine(compressed_checkpoints.folders[name])
    reference = _compressed_reference(compressed_checkpoints, name)
    twin = _fp8_twin(compressed_checkpoints, name)
    worst = _worst_difference(engine, reference, twin=twin)
    resident, bf16 = _assert_resident_quantized(engine)
    print(f"{name}: max |engine - transformers| {worst:.2e}; weights {resident / bf16:.3f} of bf16")


@pytest.mark.parametrize("name", PACKED)
def test_awq_and_gptq_logits_match_their_dequantized_reference(packed_checkpoints, name):
    engine = _engine(packed_checkpoints.folders[name])
    reference = AutoModelForCausalLM.from_pretrained(
        str(packed_checkpoints.references[name]), dtype=torch.float32
    ).eval()
    worst = _worst_difference(engine, reference)
    resident, bf16 = _assert_resident_quantized(engine)
    print(f"{name}: max |engine - reference| {worst:.2e}; weights {resident / bf16:.3f} of bf16")


@pytest.mark.parametrize(
    "name", ["llama-w4a16", "llama-w8a16-g64-asym", "qwen2-w4a16-g64", "llama-fp8-dynamic"]
)
def test_peft_adapter_on_a_compressed_base_matches_peft(
    compressed_checkpoints, packed_checkpoints, name
):
    adapter = packed_checkpoints.adapters[_family(name)]
    engine = _engine(compressed_checkpoints.folders[name], **LORA)
    reference = _compressed_reference(compressed_checkpoints, name)
    peft = PeftModel.from_pretrained(reference, str(adapter)).eval()
    _assert_adapter_matters(peft)
    twin = _fp8_twin(compressed_checkpoints, name, adapter)
    worst = _worst_difference(engine, peft, LoRARequest("a", "id-a", str(adapter)), twin=twin)
    print(f"{name} + LoRA: max |engine - PEFT| {worst:.2e}")


def test_peft_adapter_on_an_awq_base_matches_peft(packed_checkpoints):
    name = "llama-awq-gemm-g128"
    adapter = packed_checkpoints.adapters["llama"]
    engine = _engine(packed_checkpoints.folders[name], **LORA)
    reference = AutoModelForCausalLM.from_pretrained(
        str(packed_checkpoints.references[name]), dtype=torch.float32
    )
    peft = PeftModel.from_pretrained(reference, str(adapter)).eval()
    _assert_adapter_matters(peft)
    worst = _worst_difference(engine, peft, LoRARequest("a", "id-a", str(adapter)))
    print(f"{name} + LoRA: max |engine - PEFT| {worst:.2e}")


TENSOR_PARALLEL = [
    "llama-w4a16",
    "llama-w8a16-g64-asym",
    "llama-fp8-dynamic",
    "llama-fp8-static",
    "qwen2-fp8-dynamic",
]


@pytest.mark.parametrize("name", TENSOR_PARALLEL)
def test_two_ranks_match_transformers(compressed_checkpoints, name):
    """Weights, scales and zero points split by rows (q/k/v, gate/up) and by whole groups of
    input columns (o, down). One tensor-parallel engine per process at a time."""
    reference = _compressed_reference(compressed_checkpoints, name)  # before the ranks wait
    twin = _fp8_twin(compressed_checkpoints, name)
    engine = _engine(compressed_checkpoints.folders[name], tensor_parallel_size=2)
    try:
        worst = _worst_difference(engine, reference, twin=twin)
    finally:
        engine.close()
    print(f"{name}, tensor parallel 2: max |engine - transformers| {worst:.2e}")


def test_two_ranks_serve_gptq_activation_order_and_an_adapter(packed_checkpoints):
    """A row-parallel split of a layer whose groups follow g_idx: each rank keeps every
    group's scales and its own columns' g_idx; an adapter's factors split alike."""
    name, adapter = "llama-gptq-g128-desc-act", packed_checkpoints.adapters["llama"]
    reference = AutoModelForCausalLM.from_pretrained(
        str(packed_checkpoints.references[name]), dtype=torch.float32
    ).eval()
    peft = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(packed_checkpoints.references[name])),
        str(adapter),
    ).eval()
    engine = _engine(packed_checkpoints.folders[name], tensor_parallel_size=2, **LORA)
    try:
        worst = _worst_difference(engine, reference)
        with_adapter = _worst_difference(engine, peft, LoRARequest("a", "id-a", str(adapter)))
    finally:
        engine.close()
    print(f"{name}, tensor parallel 2: {worst:.2e}; with LoRA {with_adapter:.2e}")


LINEAR_BYTES_OF_BF16 = {"llama-w4a16": 0.27, "llama-w8a16": 0.52, "llama-fp8-dynamic": 0.52}


@pytest.mark.parametrize("name", list(LINEAR_BYTES_OF_BF16))
def test_resident_weight_bytes_are_logged_and_exported(compressed_checkpoints, name, caplog):
    """The quantized projections take their packed size (plus scales), not bf16's; the
    start-up log and /metrics report the weights' bytes."""
    with caplog.at_level(logging.INFO, logger="inference.engine.model_runner"):
        engine = _engine(compressed_checkpoints.folders[name])
    linears = [m for m in engine.model_runner.model.modules() if isinstance(m, QuantizedLinear)]
    packed = sum(m.resident_bytes() for m in linears)
    as_bf16 = sum(2 * m.in_features * m.out_features for m in linears)
    assert packed <= LINEAR_BYTES_OF_BF16[name] * as_bf16
    resident, bf16 = weight_bytes(engine.model_runner.model)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("weights take")]
    assert f"{resident / 2**20:.1f} MiB" in line and f"{bf16 / 2**20:.1f} MiB in bf16" in line
    assert "quantized " + engine.config.model_config.quantization.name in line
    assert engine.stats()["weights_bytes"] == resident
    collector = EngineCollector(engine.stats, lambda: name)
    [gauge] = [m for m in collector.collect() if m.name == "loraplex_weights_bytes"]
    assert gauge.samples[0].value == resident
    print(f"{name}: projections {packed / as_bf16:.3f} of bf16; all weights {resident} bytes")


def test_dora_on_a_quantized_base_matches_peft(compressed_checkpoints, tmp_path):
    """DoRA scales by the norm of the base weight plus the adapter's delta: the quantized
    layer's dequantized weight, as PEFT sees it on the decompressed model."""
    name = "llama-w4a16-g32-asym"
    adapter = make_peft_adapter(
        compressed_checkpoints.bases["llama"],
        tmp_path / "dora",
        targets=("q_proj", "v_proj", "down_proj"),
        use_dora=True,
        seed=5,
    )
    engine = _engine(compressed_checkpoints.folders[name], **LORA)
    reference = _compressed_reference(compressed_checkpoints, name)
    peft = PeftModel.from_pretrained(reference, str(adapter)).eval()
    _assert_adapter_matters(peft)
    worst = _worst_difference(engine, peft, LoRARequest("d", "id-d", str(adapter)))
    print(f"{name} + DoRA: max |engine - PEFT| {worst:.2e}")
