"""Time to first token of a long prompt on an idle engine, and of the same prompt again once
its prefix is cached (the engine keeps a finished prompt's full blocks for reuse)."""

import statistics
import time
from typing import Any

from gpu_suite_decode import random_prompts, sync


def time_to_first_token(engine: Any, prompt: list[int], request_id: str) -> float:
    """Seconds from add_request to the step that returns the request's first token."""
    from inference.engine import EngineRequest, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    device = engine.model_runner.device
    sync(device)
    t0 = time.perf_counter()
    engine.add_request(EngineRequest(request_id, prompt_token_ids=prompt, sampling_params=params))
    while True:
        outputs = engine.step()
        if any(o.request_id == request_id and o.new_token_ids for o in outputs):
            return time.perf_counter() - t0


def ttft_figures(engine: Any, prompt_len: int, repeats: int) -> dict[str, Any]:
    """Median TTFT over `repeats` distinct prompts, cold, then each again with its prefix
    cached; one more prompt first warms the kernels up."""
    vocab = engine.config.model_config.vocab_size
    prompts = random_prompts(repeats + 1, prompt_len, vocab, seed=11)
    time_to_first_token(engine, prompts[0], "ttft-warm")
    cold, warm = [], []
    hits_before = engine.stats()["prefix_cache_hits"]
    for i, prompt in enumerate(prompts[1:]):
        cold.append(time_to_first_token(engine, prompt, f"ttft-cold-{i}"))
        warm.append(time_to_first_token(engine, prompt, f"ttft-cached-{i}"))
    return {
        "prompt_tokens": prompt_len,
        "repeats": repeats,
        "ttft_ms": round(statistics.median(cold) * 1e3, 2),
        "ttft_cached_prefix_ms": round(statistics.median(warm) * 1e3, 2),
        "prefix_cache_hits": engine.stats()["prefix_cache_hits"] - hits_before,
    }
