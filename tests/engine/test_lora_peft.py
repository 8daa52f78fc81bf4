"""The engine's LoRA forward against PEFT's own, on real PEFT adapters: same logits (fp32,
1e-4) at prefill and at every decode step, with several adapters and the base model mixed
in one batch, ranks padded up to max_lora_rank, and partial target sets."""

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from inference.engine import EngineRequest, SamplingParams
from tests.engine.lora_fixtures import ALL_LINEAR, ATTENTION, lora_engine, request_for
from tests.engine.stepping import step_logits

VARIANTS = {
    "r4_attention": {"rank": 4, "alpha": 8, "targets": ATTENTION},
    "r8_all": {"rank": 8, "alpha": 16, "targets": ALL_LINEAR},
    "r16_all_rslora": {"rank": 16, "alpha": 32, "targets": ALL_LINEAR, "use_rslora": True},
    "r16_qv": {"rank": 16, "alpha": 16, "targets": ("q_proj", "v_proj")},
    "r8_mlp": {"rank": 8, "alpha": 4, "targets": ("gate_proj", "up_proj", "down_proj")},
}
LENGTHS = (1, 6, 13, 40, 9, 22)


def peft_next_logits(model, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0, -1]


@pytest.fixture(scope="module")
def peft_models(lora_model_dir, adapters):
    """Each variant's adapter applied by PEFT itself, plus the plain base (key None)."""
    models = {None: AutoModelForCausalLM.from_pretrained(lora_model_dir).eval()}
    for name, kwargs in VARIANTS.items():
        base = AutoModelForCausalLM.from_pretrained(lora_model_dir)
        models[name] = PeftModel.from_pretrained(base, adapters(name, **kwargs)).eval()
    return models


@pytest.mark.parametrize("decode_kv", ["buffered", "gathered"])
def test_mixed_batch_logits_match_peft_at_prefill_and_decode(
    lora_model_dir, adapters, peft_models, decode_kv
):
    engine = lora_engine(lora_model_dir, max_loras=len(VARIANTS), max_lora_rank=16)
    if decode_kv == "gathered":
        engine.model_runner.input_builder.decode_buffers.budget_bytes = 0
    names = [*VARIANTS, None]
    requests = {n: request_for(n, adapters(n, **VARIANTS[n])) for n in VARIANTS}
    futures = [engine.load_lora(r) for r in requests.values()]
    while not all(f.done() for f in futures):
        engine.step()
        engine.wait_for_load(0.05)
    assert [f.result() for f in futures] == [None] * len(futures)
    torch.manual_seed(0)
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    for i, (name, n) in enumerate(zip(names, LENGTHS, strict=True)):
        ids = torch.randint(3, 384, (n,)).tolist()
        engine.add_request(
            EngineRequest(
                f"r{i}",
                prompt_token_ids=ids,
                sampling_params=params,
                lora_request=requests.get(name),
            )
        )
    adapter_of = {f"r{i}": name for i, name in enumerate(names)}
    for _ in range(5):
        rows = step_logits(engine)
        assert len(rows) == len(names)
        assert len({s.lora_slot for s, _ in rows}) == len(names)  # every adapter in its own slot
        for seq, row in rows:
            expected = peft_next_logits(peft_models[adapter_of[seq.request_id]], seq.token_ids)
            torch.testing.assert_close(row, expected, atol=1e-4, rtol=0)
            seq.token_ids.append(int(expected.argmax()))


def test_adapters_change_the_output(peft_models):
    """Guards the test above: each adapter's logits differ visibly from the base model's."""
    ids = list(range(3, 20))
    base = peft_next_logits(peft_models[None], ids)
    for name in VARIANTS:
        assert (peft_next_logits(peft_models[name], ids) - base).abs().max() > 1e-2, name


def test_greedy_generation_matches_peft_generate(lora_model_dir, adapters, peft_models):
    engine = lora_engine(lora_model_dir, max_loras=2)
    name = "r16_all_rslora"
    request = request_for(name, adapters(name, **VARIANTS[name]))
    prompt = engine.tokenizer.encode("The quick brown fox jumps")
    [out] = engine.generate(
        [prompt],
        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
        lora_request=request,
    )
    expected = (
        peft_models[name]
        .generate(
            input_ids=torch.tensor([prompt]),
            max_new_tokens=16,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :]
        .tolist()
    )
    assert out.token_ids == expected and out.error is None
