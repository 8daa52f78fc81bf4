"""The GPU suite's compile_count section: an engine compiles every kernel variant it can
launch while it starts (inference/engine/kernel_warmup.py), so a run of mixed batches
afterwards compiles none. Counted two ways: Triton's compilations (on the GPU; the
interpreter compiles nothing), and the launches whose variant the start-up list lacks
(on both)."""

import random
from typing import Any

from gpu_suite_context import Context
from gpu_suite_models import build_random_llama, llama_shape, write_random_adapters

SHOWN = 5  # unexpected compilations or launches named in the figures
# Each round's requests arrive together: the prompt tokens each has past the shared prefix
# (None: a long prompt, prefilled in chunks beside the others' decodes)
ROUNDS = ((4, None), (20, 21, 22), (40,) * 8, (0,) * 6)
TINY_ROUNDS = ((4, None), (1, 2, 3), (0,) * 6)  # the interpreter: fewer steps, each path met


def compile_count(ctx: Context) -> dict[str, Any]:
    from inference.engine.kernel_warmup import listed_variants
    from inference.kernels.compilation import count_compilations, recorded_launches

    p = ctx.profile
    shape = llama_shape(*p.correctness_shape)
    folder = ctx.workdir / "compile_count"
    hf = build_random_llama(folder, shape, device=ctx.device, dtype=ctx.dtype, init_std=0.02)
    hf, wide = write_random_adapters(hf, folder / "adapters-r16", 2, rank=16)
    _, narrow = write_random_adapters(hf, folder / "adapters-r8", 1, rank=8)
    with count_compilations() as at_start:
        engine = ctx.engine(
            folder, enable_lora=True, max_loras=2, max_cpu_loras=4, max_lora_rank=16,
            max_num_seqs=8, max_cudagraph_capture_size=4,
            max_num_batched_tokens=64 if ctx.tiny else 256,  # a long prompt prefills in chunks
            kv_cache_bytes=min(p.kv_cache_bytes, 1 << 30),
        )  # fmt: skip
    try:
        warmup = engine.model_runner.kernel_warmup
        listed = listed_variants(engine.config)
        with count_compilations() as serving, recorded_launches(execute=True) as launched:
            rounds = TINY_ROUNDS if ctx.tiny else ROUNDS
            steps = mixed_batches(engine, wide + narrow, shape["vocab_size"], p.max_model_len,
                                  rounds)  # fmt: skip
        hits = engine.block_manager.stats.hits
    finally:
        engine.close()
    unlisted = sorted(k.describe() for k in set(launched) - listed)
    return {
        "variants": len(listed),
        "warmup_s": None if warmup is None else round(warmup.seconds, 2),
        "compile_jobs": None if warmup is None else warmup.jobs,
        "warmup_failures": [] if warmup is None else warmup.failures[:SHOWN],
        "compiled_at_startup": len(at_start),
        "compiled_after_warmup": len(serving),
        "compiled_after_warmup_first": serving[:SHOWN],
        "steps": steps,
        "launches": len(launched),
        "prefix_cache_hits": hits,
        "unlisted_launches": len(unlisted),
        "unlisted_first": unlisted[:SHOWN],
    }


def mixed_batches(engine: Any, adapters: list[Any], vocab: int, max_model_len: int,
                  rounds: tuple[tuple[int | None, ...], ...]) -> int:  # fmt: skip
    """Rounds of requests over adapters of two ranks and the base model: long and short
    prompts (chunked prefill beside decodes), repeated prefixes (cache hits), decode batches
    inside and beyond the CUDA graphs' sizes. The engine steps taken."""
    from inference.engine import EngineRequest, LoRARequest, SamplingParams

    loras = [LoRARequest(f"c{i}", f"c{i}", str(f)) for i, f in enumerate(adapters)] + [None]
    draw = random.Random(0)
    shared = [draw.randrange(3, vocab) for _ in range(40)]
    long = min(300, max_model_len // 2)
    steps = 0
    for r, tails in enumerate(rounds):
        for i, tail in enumerate(tails):
            extra = long if tail is None else tail
            prompt = shared + [draw.randrange(3, vocab) for _ in range(extra)]
            params = SamplingParams(temperature=0, max_tokens=2 + i % 4, ignore_eos=True)
            engine.add_request(EngineRequest(f"m{r}-{i}", prompt_token_ids=prompt,
                                             sampling_params=params,
                                             lora_request=loras[(r + i) % len(loras)]))  # fmt: skip
        while engine.has_unfinished():
            before = engine.num_steps
            engine.step()
            if engine.num_steps == before:  # an adapter is loading
                engine.wait_for_load(0.05)
            steps += engine.num_steps - before
    return steps
