"""The GPU suite's sections, one function each, every one run in a process of its own:
it builds what it needs (or loads what serving_model saved in the shared folder), returns
its figures, and leaves nothing behind but files."""

import importlib.metadata
import os
from typing import Any

from gpu_suite_context import Context
from gpu_suite_correctness import compare_greedy
from gpu_suite_decode import (
    copy_bandwidth,
    decode_bytes_per_step,
    engine_decode,
    hf_decode,
    random_prompts,
)
from gpu_suite_kernels import (
    ATTENTION_8B,
    ATTENTION_TINY,
    lora_kernels_check,
    paged_attention_check,
)
from gpu_suite_lora import load_adapters, lora_batch_figures, swap_in_figures
from gpu_suite_models import (
    LLAMA3_8B,
    build_random_llama,
    llama_shape,
    param_bytes,
    write_random_adapters,
)
from gpu_suite_ttft import ttft_figures

Figures = dict[str, Any]
LORA_GOAL = 0.85  # of the base model's tokens/s, 32 distinct adapters in a batch of 32
# Engine settings for the greedy comparison with transformers: the ones that make split-K
# reductions deterministic, so a near-tie falls the same way on every run.
DETERMINISTIC_SETTINGS: dict[str, Any] = {"deterministic_kernels": True}


def environment(ctx: Context) -> Figures:
    import torch

    versions: dict[str, str | None] = {}
    for package in ("torch", "triton", "transformers", "peft", "safetensors"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    figures: Figures = {
        "versions": versions,
        "device": str(ctx.device),
        "dtype": ctx.profile.dtype,
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        "cuda_available": torch.cuda.is_available(),
    }
    if ctx.device.type == "cuda":
        if not figures["cuda_available"]:
            return figures  # the parent stops the run here
        props = torch.cuda.get_device_properties(ctx.device)
        figures["device_name"] = props.name
        figures["device_memory_gib"] = round(props.total_memory / 2**30, 1)
        figures["capability"] = f"{props.major}.{props.minor}"
    # the bandwidth yardstick of the decode sections
    figures["copy"] = copy_bandwidth(ctx.device, ctx.profile.copy_bytes, 5 if ctx.tiny else 50)
    return figures


def correctness(ctx: Context) -> Figures:
    import torch

    p = ctx.profile
    shape = llama_shape(*p.correctness_shape)
    folder = ctx.workdir / "correctness"
    hf = build_random_llama(folder, shape, device=ctx.device, dtype=ctx.dtype,
                            init_std=p.init_std, seed=1)  # fmt: skip
    engine = ctx.engine(folder, max_num_seqs=4, kv_cache_bytes=min(p.kv_cache_bytes, 1 << 30),
                        **DETERMINISTIC_SETTINGS)  # fmt: skip
    try:
        prompt = random_prompts(1, p.correctness_prompt, shape["vocab_size"], seed=3)[0]
        figures = compare_greedy(engine, hf, prompt, p.correctness_tokens,
                                 bf16=ctx.dtype == torch.bfloat16)  # fmt: skip
    finally:
        engine.close()
    figures["shape"] = shape
    figures["deterministic_settings"] = DETERMINISTIC_SETTINGS
    return figures


def kernels(ctx: Context) -> Figures:
    import torch

    tolerance = 2e-2 if ctx.dtype == torch.bfloat16 else 1e-4
    attention = paged_attention_check(ATTENTION_TINY if ctx.tiny else ATTENTION_8B,
                                      ctx.dtype, ctx.device)  # fmt: skip
    n = 4 if ctx.tiny else 32
    lora = lora_kernels_check(ctx.tiny, ctx.dtype, ctx.device, tokens=n, adapters=n)
    worst = max(
        attention["decode_max_rel_err"], attention["extend_max_rel_err"], lora["max_rel_err"]
    )
    return {
        "tolerance": tolerance,
        "match_reference": worst <= tolerance,
        "paged_attention": attention,
        "lora": lora,
    }


def serving_model(ctx: Context) -> Figures:
    """Random Llama-3-8B weights made on the device, saved once (safetensors) for every later
    section to load, and PEFT adapters of them."""
    p = ctx.profile
    shape = LLAMA3_8B if p.big_shape is None else llama_shape(*p.big_shape)
    hf = build_random_llama(ctx.served, shape, device=ctx.device, dtype=ctx.dtype,
                            init_std=0.02, seed=2)  # fmt: skip
    hf, adapters = write_random_adapters(hf, ctx.workdir / "adapters", p.adapters)
    adapter_bytes = sum(f.stat().st_size for f in adapters[0].iterdir())
    return {
        "shape": shape,
        "weights_gb": round(param_bytes(hf) / 1e9, 2),
        "adapters": len(adapters),
        "adapter_folder_mb": round(adapter_bytes / 1e6, 2),
    }


def lora_batch(ctx: Context) -> Figures:
    p, adapters = ctx.profile, ctx.adapters()
    n = len(adapters)
    engine = ctx.engine(ctx.served, enable_lora=True, max_loras=n, max_cpu_loras=n,
                        max_lora_rank=16, max_num_seqs=n)  # fmt: skip
    try:
        figures = lora_batch_figures(engine, adapters, p.prompt_len, p.warm_steps, p.decode_steps)
    finally:
        engine.close()
    figures["ratio"] = figures["ratio_same_engine"]
    figures["goal"] = LORA_GOAL
    figures["meets_goal"] = figures["ratio"] >= LORA_GOAL
    return figures


def lora_swap(ctx: Context) -> Figures:
    """One adapter brought to host memory, then its slot write timed against a plain copy."""
    engine = ctx.engine(ctx.served, enable_lora=True, max_loras=4, max_cpu_loras=4,
                        max_lora_rank=16, max_num_seqs=4, enforce_eager=True)  # fmt: skip
    try:
        load_adapters(engine, ctx.adapters()[:1])
        return swap_in_figures(engine, ctx.profile.swap_reps)
    finally:
        engine.close()


def _decode(ctx: Context, enforce_eager: bool) -> Figures:
    """The engine's decode tokens/s at each batch size, and the bandwidth each step reaches
    as a share of the environment's device-to-device copy."""
    p = ctx.profile
    copy_gb_s = ctx.earlier("environment").get("copy", {}).get("gb_per_s")
    engine = ctx.engine(ctx.served, max_num_seqs=max(p.batches), enforce_eager=enforce_eager)
    rows = []
    try:
        for batch in p.batches:
            try:
                row = engine_decode(engine, batch, p.prompt_len, p.warm_steps, p.decode_steps,
                                    seed=batch)  # fmt: skip
            except Exception as error:  # one batch size failing leaves the others
                rows.append({"batch": batch, "error": f"{type(error).__name__}: {error}"})
                continue
            row["bytes_per_step"] = decode_bytes_per_step(engine, row["mean_context_tokens"],
                                                          batch)  # fmt: skip
            gb_s = row["bytes_per_step"] / (row["step_ms"] / 1e3) / 1e9
            row["gb_per_s"] = float(f"{gb_s:.4g}")
            if copy_gb_s:
                row["share_of_copy"] = float(f"{gb_s / copy_gb_s:.3g}")
            rows.append(row)
        # whether decode steps replayed graphs (the engine captures them on CUDA only)
        captured = getattr(engine.model_runner, "graphs", None) is not None
    finally:
        engine.close()
    return {"rows": rows, "graphs_captured": captured, "copy_gb_per_s": copy_gb_s}


def decode_graphs(ctx: Context) -> Figures:
    return _decode(ctx, enforce_eager=False)


def decode_eager(ctx: Context) -> Figures:
    return _decode(ctx, enforce_eager=True)


def ttft(ctx: Context) -> Figures:
    engine = ctx.engine(ctx.served, max_num_seqs=4, enforce_eager=True)
    try:
        return ttft_figures(engine, ctx.profile.ttft_prompt, ctx.profile.ttft_repeats)
    finally:
        engine.close()


def transformers_generate(ctx: Context) -> Figures:
    """transformers' `generate` on the served model, and the engine's eager decode over it."""
    from transformers import LlamaForCausalLM

    p = ctx.profile
    model = LlamaForCausalLM.from_pretrained(
        ctx.served, dtype=ctx.dtype, device_map=str(ctx.device)
    )
    model.eval()
    vocab = model.config.vocab_size
    rows = []
    for batch in p.hf_batches:
        try:
            rows.append(hf_decode(model, batch, p.prompt_len, p.hf_steps, vocab))
        except Exception as error:
            rows.append({"batch": batch, "error": f"{type(error).__name__}: {error}"})
    eager = ctx.earlier("decode_eager").get("rows", [])
    engine = {r["batch"]: r for r in eager if "error" not in r}
    for row in rows:
        if "error" not in row and row["batch"] in engine:
            row["engine_over_transformers"] = round(
                engine[row["batch"]]["tokens_per_s"] / row["tokens_per_s"], 2
            )
    return {"rows": rows}
