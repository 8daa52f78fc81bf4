"""Many adapters in one batch, and an adapter's swap-in.

Batch: one request per adapter, every adapter distinct (all seven projections, rank 16),
decoded together, against the same batch on the base model. Swap-in: the engine's own slot
write of one host adapter (one copy of its slot row, from pinned memory on CUDA) against a
plain pinned host-to-device copy of the same bytes, both timed on the device's clock.
"""

import time
from pathlib import Path
from typing import Any

import torch
from common import percentile
from gpu_suite_decode import engine_decode, random_prompts, sync


def load_adapters(engine: Any, folders: list[Path]) -> list[Any]:
    """Bring every adapter into host memory through the engine's loader; their requests."""
    from inference.engine import LoRARequest

    requests = [LoRARequest(f"bench-{i}", f"bench-{i}", str(f)) for i, f in enumerate(folders)]
    futures = [engine.load_lora(r) for r in requests]
    while not all(f.done() for f in futures):
        engine.step()
        engine.wait_for_load(0.01)
    for f in futures:
        f.result()  # raises the loader's error, if any
    return requests


def lora_decode(
    engine: Any, requests: list[Any], prompt_len: int, warm_steps: int, steps: int
) -> dict[str, Any]:
    """engine_decode's measurement with request i on adapter i."""
    from inference.engine import EngineRequest, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=warm_steps + steps + 2, ignore_eos=True)
    vocab = engine.config.model_config.vocab_size
    prompts = random_prompts(len(requests), prompt_len, vocab, seed=7)
    ids = [f"lora-{i}" for i in range(len(requests))]
    device = engine.model_runner.device
    for rid, prompt, lora in zip(ids, prompts, requests, strict=True):
        engine.add_request(
            EngineRequest(rid, prompt_token_ids=prompt, sampling_params=params, lora_request=lora)
        )
    try:
        started: set[str] = set()
        while len(started) < len(ids):  # adapter swap-ins and prefill
            outputs = engine.step()
            started |= {o.request_id for o in outputs if o.new_token_ids}
            errors = [o.error for o in outputs if o.error is not None]
            if errors:
                raise RuntimeError(f"a LoRA request failed: {errors[0]}")
            if not outputs:
                engine.wait_for_load(0.01)
        for _ in range(warm_steps):
            engine.step()
        sync(device)
        t0 = time.perf_counter()
        tokens = sum(len(o.new_token_ids) for _ in range(steps) for o in engine.step())
        sync(device)
        seconds = time.perf_counter() - t0
    finally:
        for rid in ids:
            engine.abort(rid)
        engine.step()
    return {
        "batch": len(ids),
        "distinct_adapters": len({r.adapter_id for r in requests}),
        "steps": steps,
        "step_ms": round(seconds / steps * 1e3, 3),
        "tokens_per_s": round(tokens / seconds, 1),
    }


def lora_batch_figures(
    engine: Any, folders: list[Path], prompt_len: int, warm: int, steps: int
) -> dict[str, Any]:
    requests = load_adapters(engine, folders)
    lora = lora_decode(engine, requests, prompt_len, warm, steps)
    base = engine_decode(engine, len(requests), prompt_len, warm, steps, seed=7)
    return {
        "lora": lora,
        "base_same_engine": base,
        "ratio_same_engine": round(lora["tokens_per_s"] / base["tokens_per_s"], 3),
    }


def _time_on_device(device: torch.device, fn: Any) -> float:
    """Seconds of fn(), on CUDA events (queued copies included) or the wall clock."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def swap_in_figures(engine: Any, reps: int) -> dict[str, Any]:
    """p50/p99 of the engine's slot write of one adapter and of a plain pinned copy of the
    same bytes (the adapters must be in host memory: run after lora_batch_figures)."""
    slots, manager = engine.model_runner.lora_slots, engine.lora_manager
    hosted = [e.host for e in manager.adapters.values() if e.host is not None]
    if not hosted:
        raise RuntimeError("no adapter is in host memory; load some first")
    adapter = hosted[0]
    device = slots.device
    source = adapter.weights
    target = torch.empty(source.shape, dtype=source.dtype, device=device)
    engine_s, plain_s = [], []
    for i in range(reps + 5):  # the first few warm the copy paths up
        slot = i % slots.num_slots
        e = _time_on_device(device, lambda slot=slot: slots.write(slot, adapter))
        p = _time_on_device(device, lambda: target.copy_(source, non_blocking=True))
        if i >= 5:
            engine_s.append(e)
            plain_s.append(p)
    sync(device)
    p99, plain_p99 = percentile(engine_s, 99), percentile(plain_s, 99)
    return {
        "adapter_mb": round(adapter.nbytes / 1e6, 2),
        "pinned": bool(source.is_pinned()) if device.type == "cuda" else None,
        "reps": reps,
        "swap_in_p50_ms": round(percentile(engine_s, 50) * 1e3, 3),
        "swap_in_p99_ms": round(p99 * 1e3, 3),
        "plain_copy_p50_ms": round(percentile(plain_s, 50) * 1e3, 3),
        "plain_copy_p99_ms": round(plain_p99 * 1e3, 3),
        "p99_over_plain_p99": round(p99 / plain_p99, 3),
        "goal_within_1_5x": p99 <= 1.5 * plain_p99,
        "goal_under_10_ms": p99 < 0.010,
    }
