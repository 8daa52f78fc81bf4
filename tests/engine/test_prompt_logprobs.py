"""Prompt logprobs and scoring against transformers (and PEFT for adapters), fp32: every
prompt token's logprob, its rank and the top k, through one or several prefill chunks."""

import asyncio

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from inference.engine import (
    AsyncLLMEngine,
    EngineRequest,
    InvalidRequestError,
    Priority,
    SamplingParams,
    SamplingParamsError,
)
from tests.engine.lora_fixtures import lora_engine, request_for, run_all

PROMPT = [3 + (i * 37) % 380 for i in range(45)]
ADAPTER = {"rank": 8, "alpha": 16}


@pytest.fixture(scope="module")
def reference(lora_model_dir, adapters):
    """log-softmax over the prompt by transformers (base) and PEFT (adapter)."""
    base = AutoModelForCausalLM.from_pretrained(lora_model_dir, dtype=torch.float32).eval()
    tuned = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(lora_model_dir, dtype=torch.float32),
        adapters("p0", **ADAPTER),
    ).eval()
    out = {}
    for name, model in (("base", base), ("p0", tuned)):
        with torch.no_grad():
            out[name] = model(torch.tensor([PROMPT])).logits[0].log_softmax(-1)
    return out


def prompt_logprobs(engine, k, lora=None, prompt=PROMPT):
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=k)
    engine.add_request(
        EngineRequest("r", prompt_token_ids=prompt, sampling_params=params, lora_request=lora)
    )
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
        engine.wait_for_load(0.01)
    firsts = [o.prompt_logprobs for o in outputs if o.prompt_logprobs is not None]
    assert len(firsts) == 1  # on the first output only
    return firsts[0]


@pytest.mark.parametrize("adapter", [None, "p0"])
@pytest.mark.parametrize("budget", [None, 16])  # one prefill step, or three chunks
def test_prompt_logprobs_equal_transformers(lora_model_dir, adapters, reference, adapter, budget):
    kwargs = {"max_num_batched_tokens": budget, "max_num_seqs": 4} if budget else {}
    engine = lora_engine(lora_model_dir, **kwargs)
    lora = request_for(adapter, adapters(adapter, **ADAPTER)) if adapter else None
    entries = prompt_logprobs(engine, 3, lora)
    expected = reference[adapter or "base"]
    assert len(entries) == len(PROMPT) and entries[0] is None
    for i, entry in enumerate(entries[1:], start=1):
        row = expected[i - 1]
        assert entry.token_id == PROMPT[i]
        assert entry.logprob == pytest.approx(row[PROMPT[i]].item(), abs=1e-4)
        assert entry.rank == int((row > row[PROMPT[i]]).sum()) + 1
        top = row.topk(3)
        assert [t for t, _ in entry.top] == top.indices.tolist()
        assert [v for _, v in entry.top] == pytest.approx(top.values.tolist(), abs=1e-4)


def test_prompt_logprobs_skip_the_prefix_cache(lora_model_dir, reference):
    engine = lora_engine(lora_model_dir)
    engine.add_request(
        EngineRequest("warm", prompt_token_ids=PROMPT, sampling_params=SamplingParams(max_tokens=1))
    )
    run_all(engine)
    entries = prompt_logprobs(engine, 0)  # the prompt is cached, yet every position is there
    assert len(entries) == len(PROMPT)
    got = torch.tensor([e.logprob for e in entries[1:]])
    expected = reference["base"][:-1].gather(1, torch.tensor(PROMPT[1:])[:, None])[:, 0]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert all(e.top == [] for e in entries[1:])


def test_a_one_token_prompt_has_one_empty_entry(lora_model_dir):
    assert prompt_logprobs(lora_engine(lora_model_dir), 2, prompt=[5]) == [None]


@pytest.mark.parametrize("bad", [-1, 21, 2.5, True, "1"])
def test_bad_prompt_logprobs_are_refused(bad):
    with pytest.raises(SamplingParamsError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=bad)


def test_score_is_the_completion_log_likelihood(lora_model_dir, adapters, reference):
    engine = lora_engine(lora_model_dir)
    lora = request_for("p0", adapters("p0", **ADAPTER))
    for name, req in (("base", None), ("p0", lora)):
        result = engine.score(PROMPT[:30], PROMPT[30:], req)
        expected = reference[name][29:-1].gather(1, torch.tensor(PROMPT[30:])[:, None])[:, 0]
        assert result.num_tokens == 15
        assert result.token_logprobs == pytest.approx(expected.tolist(), abs=1e-4)
        assert result.logprob == pytest.approx(expected.sum().item(), abs=1e-3)
    assert engine.requests == {} and engine.block_manager.num_used_blocks == 0


def test_async_score_runs_at_background_priority(lora_model_dir, reference):
    async def main():
        engine = AsyncLLMEngine(lora_engine(lora_model_dir))
        try:
            return await engine.score(PROMPT[:10], PROMPT[10:20])
        finally:
            engine.shutdown()

    result = asyncio.run(main())
    expected = reference["base"][9:19].gather(1, torch.tensor(PROMPT[10:20])[:, None])[:, 0]
    assert result.token_logprobs == pytest.approx(expected.tolist(), abs=1e-4)


def test_score_refuses_an_empty_side(lora_model_dir):
    engine = lora_engine(lora_model_dir)
    for prompt, completion in (([], [5]), ([5], [])):
        with pytest.raises(InvalidRequestError, match="non-empty"):
            engine.score(prompt, completion)
    assert engine.requests == {}


def test_prompt_logprobs_survive_a_preemption_mid_prompt(lora_model_dir, reference):
    """Preempted after two of its chunks, the request is recomputed from its start and
    keeps the entries it had: each prompt token has exactly one, equal to transformers'."""
    engine = lora_engine(lora_model_dir, max_num_batched_tokens=16, max_num_seqs=1)
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    engine.add_request(
        EngineRequest(
            "scored",
            prompt_token_ids=PROMPT,
            sampling_params=params,
            priority=Priority.BACKGROUND,
        )
    )
    engine.step()
    engine.step()
    engine.add_request(EngineRequest("tenant", prompt_token_ids=[5, 6], sampling_params=params))
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    assert engine.scheduler.num_preemptions == 1
    [entries] = [o.prompt_logprobs for o in outputs if o.request_id == "scored"]
    got = torch.tensor([e.logprob for e in entries[1:]])
    expected = reference["base"][:-1].gather(1, torch.tensor(PROMPT[1:])[:, None])[:, 0]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
