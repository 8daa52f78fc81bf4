"""Tensor parallelism on CPU (gloo, two ranks): the sharded engine's logits equal the whole
model's (1e-4, fp32) at prefill and at every decode step, for the base model and a mixed
batch of real PEFT adapters; what it cannot serve exactly is refused with the reason; a
lost rank fails the engine's requests instead of hanging them."""

import asyncio
import os
import signal

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from inference.engine import (
    AsyncLLMEngine,
    EngineConfig,
    EngineDeadError,
    EngineRequest,
    LLMEngine,
    SamplingParams,
)
from inference.engine.errors import AdapterLoadError, ConfigError
from inference.engine.parallel_workers import RankFailedError
from tests.engine.lora_fixtures import ALL_LINEAR, ATTENTION, lora_engine, request_for
from tests.engine.stepping import step_logits
from tests.tiny_llama import make_tiny_llama

VARIANTS = {
    "r8_all": {"rank": 8, "alpha": 16, "targets": ALL_LINEAR},
    "r4_attention": {"rank": 4, "alpha": 8, "targets": ATTENTION},
}
LENGTHS = (6, 13, 9)


@pytest.fixture(scope="module")
def tp_engine(lora_model_dir):
    engine = lora_engine(
        lora_model_dir, max_loras=len(VARIANTS), max_lora_rank=8, tensor_parallel_size=2
    )
    yield engine
    engine.close()


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_a_vocabulary_that_does_not_divide_pads_the_last_ranks_shard(tmp_path, tie):
    """385 tokens over two ranks: rank 1's rows of the embedding and of lm_head end in a
    zero row that no token id reaches and no logit is read from. Before the module's engine
    starts: a process hosts one tensor-parallel engine at a time."""
    model_dir = make_tiny_llama(tmp_path, vocab=385, tie=tie)
    hf = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    engine = LLMEngine(model=model_dir, kv_cache_bytes=1 << 20, tensor_parallel_size=2)
    try:
        # ids on both sides of the split (192 | 193) and the last one, on the padded shard
        ids = [5, 192, 193, 384, 17, 383]
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        engine.add_request(EngineRequest("r", prompt_token_ids=ids, sampling_params=params))
        for _ in range(3):  # the prefill, then decodes
            ((seq, row),) = step_logits(engine)
            assert row.shape == (385,)
            with torch.no_grad():
                expected = hf(torch.tensor([seq.token_ids])).logits[0, -1]
            torch.testing.assert_close(row, expected, atol=1e-4, rtol=0)
            seq.token_ids.append(int(expected.argmax()))
        engine.abort("r")
        engine.step()
    finally:
        engine.close()


def test_mixed_batch_logits_match_one_rank_and_peft(lora_model_dir, adapters, tp_engine):
    single = lora_engine(lora_model_dir, max_loras=len(VARIANTS), max_lora_rank=8)
    requests = {n: request_for(n, adapters(n, **kw)) for n, kw in VARIANTS.items()}
    peft = {None: AutoModelForCausalLM.from_pretrained(lora_model_dir).eval()}
    for name, kwargs in VARIANTS.items():
        base = AutoModelForCausalLM.from_pretrained(lora_model_dir)
        peft[name] = PeftModel.from_pretrained(base, adapters(name, **kwargs)).eval()
    for engine in (single, tp_engine):  # in their slots before the first step
        futures = [engine.load_lora(r) for r in requests.values()]
        while not all(f.done() for f in futures):
            engine.step()
            engine.wait_for_load(0.05)
        assert [f.result() for f in futures] == [None] * len(futures)
    names = [*VARIANTS, None]
    torch.manual_seed(0)
    prompts = [torch.randint(3, 384, (n,)).tolist() for n in LENGTHS]
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    for engine in (single, tp_engine):
        for i, (name, ids) in enumerate(zip(names, prompts, strict=True)):
            engine.add_request(
                EngineRequest(
                    f"r{i}",
                    prompt_token_ids=ids,
                    sampling_params=params,
                    lora_request=requests.get(name),
                )
            )
    adapter_of = {f"r{i}": name for i, name in enumerate(names)}
    worst = 0.0
    for _ in range(4):  # the prefill, then decodes
        one, two = step_logits(single), step_logits(tp_engine)
        assert [s.request_id for s, _ in one] == [s.request_id for s, _ in two]
        assert len(two) == len(names)
        for (seq, row), (tp_seq, tp_row) in zip(one, two, strict=True):
            with torch.no_grad():
                expected = peft[adapter_of[seq.request_id]](torch.tensor([seq.token_ids]))
            expected = expected.logits[0, -1]
            torch.testing.assert_close(tp_row, row, atol=1e-4, rtol=0)
            torch.testing.assert_close(tp_row, expected, atol=1e-4, rtol=0)
            worst = max(worst, float((tp_row - row).abs().max()))
            token = int(expected.argmax())
            seq.token_ids.append(token)
            tp_seq.token_ids.append(token)
    print(f"largest |TP=2 - TP=1| logit difference: {worst:.2e}")
    for engine in (single, tp_engine):
        for i in range(len(names)):
            engine.abort(f"r{i}")
        engine.step()
    single.close()


def test_rank_0_sends_the_host_inputs_it_uploads_itself(tp_engine, monkeypatch):
    """Nothing of rank 0's upload comes back to be sent: the workers get the inputs as built
    on the host, and each uploads them in one copy as rank 0 does."""
    runner = tp_engine.model_runner
    sent, uploaded = [], []
    send, upload = runner.workers.send, runner.input_builder.upload
    monkeypatch.setattr(runner.workers, "send", lambda inputs: send(sent.append(inputs) or inputs))
    monkeypatch.setattr(
        runner.input_builder, "upload", lambda inputs: upload(uploaded.append(inputs) or inputs)
    )
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    tp_engine.add_request(EngineRequest("host", prompt_token_ids=[5, 6, 7], sampling_params=params))
    while tp_engine.has_unfinished():
        tp_engine.step()
    assert len(sent) == len(uploaded) == 3
    assert all(s.forward is u for s, u in zip(sent, uploaded, strict=True))  # the same objects
    for inputs in sent:
        ctx = inputs.forward.ctx
        assert ctx.slot_mapping.device.type == "cpu" and ctx.lora is None


def test_dora_is_refused_under_tensor_parallelism(adapters, tp_engine):
    path = adapters("dora", rank=4, alpha=8, targets=ATTENTION, use_dora=True)
    future = tp_engine.load_lora(request_for("dora", path))
    while not future.done():
        tp_engine.step()
        tp_engine.wait_for_load(0.05)
    with pytest.raises(AdapterLoadError, match="tensor-parallel engine does not serve.*DoRA"):
        future.result()


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (3, "tensor_parallel_size 3 does not divide its 4 attention heads"),
        (0, "tensor_parallel_size must be a positive integer"),
        ("2", "tensor_parallel_size must be a positive integer"),
        (True, "tensor_parallel_size must be a positive integer"),
    ],
)
def test_a_size_the_model_cannot_be_split_by_is_refused(lora_model_dir, size, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(model=lora_model_dir, tensor_parallel_size=size)


@pytest.mark.parametrize("value", ["0", "-5", "soon", "nan", "inf"])
def test_a_bad_timeout_is_refused_before_any_rank_starts(lora_model_dir, monkeypatch, value):
    monkeypatch.setenv("LORAPLEX_TP_TIMEOUT_SECONDS", value)
    with pytest.raises(ConfigError, match=f"must be a positive number of seconds, got '{value}'"):
        EngineConfig(model=lora_model_dir, tensor_parallel_size=2)


def test_a_second_tensor_parallel_engine_in_the_process_is_refused(lora_model_dir, tp_engine):
    with pytest.raises(ConfigError, match="one tensor-parallel engine at a time"):
        LLMEngine(model=lora_model_dir, kv_cache_bytes=1 << 20, tensor_parallel_size=2)


def test_killing_rank_1_fails_the_running_requests_and_the_engine(tp_engine):
    """Last in this module: it ends the module's engine."""
    failures = []
    engine = AsyncLLMEngine(tp_engine, on_failure=failures.append)
    workers = tp_engine.model_runner.workers
    assert workers is not None
    long = SamplingParams(max_tokens=400, ignore_eos=True)

    async def main():
        stream = engine.generate(EngineRequest("long", "Paris", long))
        await stream.__anext__()
        os.kill(workers.processes[0].pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError, match="RankFailedError"):
            async with asyncio.timeout(60):
                async for _ in stream:
                    pass

    try:
        asyncio.run(main())
        assert not engine.is_alive()
    finally:
        engine.shutdown()  # joins the step thread, which tells its owner after the streams
    assert [type(f) for f in failures] == [RankFailedError]
    assert f"rank 1 (pid {workers.processes[0].pid}) exited with code -9" in str(failures[0])
