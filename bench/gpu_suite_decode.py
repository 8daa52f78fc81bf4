"""Decode speed: the engine's steady decode steps at a batch size, transformers' `generate`
at the same shapes, a device-to-device copy as the bandwidth yardstick, and the share of it
a decode step reaches.

A decode step must read every weight once (the embedding table excepted: only the batch's
rows) and every running sequence's cached keys and values; those bytes over the step's time
is the bandwidth decode achieves. A copy reads and writes each byte once, so its rate is
(2 x bytes) / time: the most traffic the memory sustains in this run.
"""

import time
from typing import Any

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """Distinct random prompts (token ids 3..vocab-1), so no prefix is shared."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (count, length), generator=generator).tolist()


def engine_decode(
    engine: Any, batch: int, prompt_len: int, warm_steps: int, steps: int, seed: int = 0
) -> dict[str, Any]:
    """Run `batch` requests together; once all are prefilled and `warm_steps` decode steps
    ran, time `steps` decode steps."""
    from inference.engine import EngineRequest, SamplingParams

    device = engine.model_runner.device
    vocab = engine.config.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=warm_steps + steps + 2, ignore_eos=True)
    ids = [f"decode-{batch}-{seed}-{i}" for i in range(batch)]
    for rid, prompt in zip(ids, random_prompts(batch, prompt_len, vocab, seed), strict=True):
        engine.add_request(EngineRequest(rid, prompt_token_ids=prompt, sampling_params=params))
    try:
        started: set[str] = set()
        while len(started) < batch:  # prefill (maybe over several steps)
            started |= {o.request_id for o in engine.step() if o.new_token_ids}
        for _ in range(warm_steps):
            engine.step()
        context_before = sum(len(engine.requests[r]) for r in ids)
        sync(device)
        t0 = time.perf_counter()
        tokens = 0
        for _ in range(steps):
            tokens += sum(len(o.new_token_ids) for o in engine.step())
        sync(device)
        seconds = time.perf_counter() - t0
        context_after = sum(len(engine.requests[r]) for r in ids)
    finally:
        for rid in ids:
            engine.abort(rid)
        engine.step()  # hands over the aborted outputs, frees their blocks
    return {
        "batch": batch,
        "prompt_tokens": prompt_len,
        "steps": steps,
        "tokens": tokens,
        "step_ms": round(seconds / steps * 1e3, 3),
        "tokens_per_s": round(tokens / seconds, 1),
        # the cached tokens each step reads, on average over the timed steps
        "mean_context_tokens": (context_before + context_after) / 2,
    }


def decode_bytes_per_step(engine: Any, mean_context_tokens: float, batch: int) -> int:
    """Weights read once (the embedding table only for the batch's rows, unless it is the
    tied head) plus the running sequences' keys and values, all layers."""
    config = engine.config
    model = engine.model_runner.model
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    mc = config.model_config
    if not mc.tie_word_embeddings:
        embed = mc.vocab_size * mc.hidden_size * config.torch_dtype.itemsize
        total -= embed - batch * mc.hidden_size * config.torch_dtype.itemsize
    kv_per_token = config.kv_block_bytes // config.block_size
    return int(total + mean_context_tokens * kv_per_token)


def hf_decode(
    model: Any, batch: int, prompt_len: int, steps: int, vocab: int, seed: int = 0
) -> dict[str, Any]:
    """transformers' greedy `generate` on `batch` equal-length prompts: a decode step's time
    is (time for 1 + steps new tokens - time for 1) / steps, so the prefill cancels out."""
    device = next(model.parameters()).device
    ids = torch.tensor(random_prompts(batch, prompt_len, vocab, seed), device=device)

    def run(new_tokens: int) -> float:
        sync(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)  # fmt: skip
        sync(device)
        return time.perf_counter() - t0

    run(2)  # warm-up
    one = run(1)
    many = run(1 + steps)
    step_s = max(many - one, 1e-9) / steps
    return {
        "batch": batch,
        "prompt_tokens": prompt_len,
        "steps": steps,
        "step_ms": round(step_s * 1e3, 3),
        "tokens_per_s": round(batch / step_s, 1),
    }


def copy_bandwidth(device: torch.device, nbytes: int, iters: int) -> dict[str, Any]:
    """Device-to-device copy rate, counting the read and the write of every byte."""
    from gpu_lora import timer

    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    ms = timer(device, 3, iters)(lambda: dst.copy_(src))
    return {
        "bytes": nbytes,
        "copy_ms": round(ms, 4),
        "gb_per_s": float(f"{2 * nbytes / ms / 1e6:.4g}"),
    }
