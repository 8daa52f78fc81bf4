"""The GPU suite's sections, one method each, and what they share: the models made on the
device and the engines built over them. A section that needs another's result and finds it
missing raises Needs, which the budget records as that section's error."""

import gc
import importlib.metadata
import os
from pathlib import Path
from typing import Any

import torch
from gpu_suite_budget import Budget, Needs
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
from gpu_suite_lora import lora_batch_figures, swap_in_figures
from gpu_suite_models import (
    LLAMA3_8B,
    build_random_llama,
    llama_shape,
    param_bytes,
    write_random_adapters,
)
from gpu_suite_ttft import ttft_figures

LORA_GOAL = 0.85  # of the base model's tokens/s, 32 distinct adapters in a batch of 32
Figures = dict[str, Any]


def engine_modes() -> list[tuple[str, dict[str, Any]]]:
    """(mode, EngineConfig settings): with CUDA graphs and eager once the engine has the
    `enforce_eager` setting (eager last: its engine stays for the TTFT), else eager only."""
    from inference.engine.config import EngineConfig

    if "enforce_eager" in EngineConfig.__dataclass_fields__:
        return [("graphs", {"enforce_eager": False}), ("eager", {"enforce_eager": True})]
    return [("eager", {})]


class Suite:
    def __init__(self, profile: Any, workdir: Path, budget: Budget):
        self.profile = profile
        self.workdir = workdir
        self.budget = budget
        self.device = torch.device(profile.device)
        self.dtype = getattr(torch, profile.dtype)
        self.tiny = self.device.type != "cuda"
        if self.tiny:
            torch.set_num_threads(1)  # a shared small CPU: threads waiting on each other add noise
        self.folder: Path | None = None  # the served model (Llama-3-8B shapes on the GPU)
        self.hf_model: Any = None
        self.adapters: list[Path] = []
        self.base_engine: Any = None
        self.lora_engine: Any = None
        self.decode_rows: dict[str, list[Figures]] = {}
        self.copy_gb_s: float | None = None

    # -- helpers -----------------------------------------------------------------------------

    def _engine(self, folder: Path, **settings: Any) -> Any:
        from inference.engine import LLMEngine

        p = self.profile
        options = {
            "device": p.device, "dtype": p.dtype, "attention_backend": p.attention_backend,
            "max_model_len": p.max_model_len, "kv_cache_bytes": p.kv_cache_bytes,
            "block_size": p.block_size, **settings,
        }  # fmt: skip
        return LLMEngine(model=folder, **options)

    def _free(self, *names: str) -> None:
        for name in names:
            engine = getattr(self, name)
            if engine is not None and hasattr(engine, "close"):
                engine.close()
            setattr(self, name, None)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def close(self) -> None:
        self._free("base_engine", "lora_engine", "hf_model")

    # -- sections ----------------------------------------------------------------------------

    def environment(self) -> Figures:
        versions: dict[str, str | None] = {}
        for package in ("torch", "triton", "transformers", "peft", "safetensors"):
            try:
                versions[package] = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                versions[package] = None
        figures: Figures = {
            "versions": versions,
            "device": str(self.device),
            "dtype": self.profile.dtype,
            "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
            "cuda_graphs": "measured" if len(engine_modes()) > 1 else "not built",
            "sections": list(self.profile.caps),
        }
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            figures["device_name"] = props.name
            figures["device_memory_gib"] = round(props.total_memory / 2**30, 1)
            figures["capability"] = f"{props.major}.{props.minor}"
        return figures

    def kernels(self) -> Figures:
        tolerance = 2e-2 if self.dtype == torch.bfloat16 else 1e-4
        shape = ATTENTION_TINY if self.tiny else ATTENTION_8B
        attention = paged_attention_check(shape, self.dtype, self.device)
        n = 4 if self.tiny else 32
        lora = lora_kernels_check(self.tiny, self.dtype, self.device, tokens=n, adapters=n)
        worst = max(
            attention["decode_max_rel_err"], attention["extend_max_rel_err"], lora["max_rel_err"]
        )
        return {
            "tolerance": tolerance,
            "match_reference": worst <= tolerance,
            "paged_attention": attention,
            "lora": lora,
        }

    def correctness(self) -> Figures:
        p = self.profile
        shape = llama_shape(*p.correctness_shape)
        folder = self.workdir / "correctness"
        hf = build_random_llama(folder, shape, device=self.device, dtype=self.dtype,
                                init_std=p.init_std, seed=1)  # fmt: skip
        engine = self._engine(folder, max_num_seqs=4, kv_cache_bytes=min(p.kv_cache_bytes, 1 << 30))
        try:
            prompt = random_prompts(1, p.correctness_prompt, shape["vocab_size"], seed=3)[0]
            figures = compare_greedy(engine, hf, prompt, p.correctness_tokens,
                                     bf16=self.dtype == torch.bfloat16)  # fmt: skip
        finally:
            engine.close()
            del engine, hf
            self._free()
        figures["shape"] = shape
        return figures

    def copy_bandwidth(self) -> Figures:
        figures = copy_bandwidth(self.device, self.profile.copy_bytes, 5 if self.tiny else 50)
        self.copy_gb_s = figures["gb_per_s"]
        return figures

    def serving_model(self) -> Figures:
        p = self.profile
        shape = LLAMA3_8B if p.big_shape is None else llama_shape(*p.big_shape)
        self.folder = self.workdir / "served"
        hf = build_random_llama(self.folder, shape, device=self.device, dtype=self.dtype,
                                init_std=0.02, seed=2)  # fmt: skip
        self.hf_model, self.adapters = write_random_adapters(
            hf, self.workdir / "adapters", p.adapters
        )
        adapter_bytes = sum(f.stat().st_size for f in self.adapters[0].iterdir())
        return {
            "shape": shape,
            "weights_gb": round(param_bytes(self.hf_model) / 1e9, 2),
            "adapters": len(self.adapters),
            "adapter_folder_mb": round(adapter_bytes / 1e6, 2),
        }

    def decode_throughput(self) -> Figures:
        if self.folder is None:
            raise Needs("serving_model", self.budget)
        p = self.profile
        captured = {}
        for mode, settings in engine_modes():
            self._free("base_engine")
            self.base_engine = self._engine(self.folder, max_num_seqs=max(p.batches), **settings)
            # whether decode steps replay graphs (the engine captures them on CUDA only)
            captured[mode] = getattr(self.base_engine.model_runner, "graphs", None) is not None
            rows = []
            for batch in p.batches:
                try:
                    rows.append(
                        engine_decode(
                            self.base_engine,
                            batch,
                            p.prompt_len,
                            p.warm_steps,
                            p.decode_steps,
                            seed=batch,
                        )
                    )
                except Exception as error:  # one batch size failing leaves the others
                    rows.append({"batch": batch, "error": f"{type(error).__name__}: {error}"})
            self.decode_rows[mode] = rows
        return {
            "eager": self.decode_rows.get("eager"),
            "graphs": self.decode_rows.get("graphs", "not built"),
            "graphs_captured": captured,
        }

    def memory_bandwidth(self) -> Figures:
        if self.base_engine is None or "eager" not in self.decode_rows:
            raise Needs("decode_throughput", self.budget)
        if self.copy_gb_s is None:
            raise Needs("copy_bandwidth", self.budget)
        figures: Figures = {"copy_gb_per_s": self.copy_gb_s}
        for mode, rows in self.decode_rows.items():
            shares = []
            for row in rows:
                if "error" in row:
                    continue
                nbytes = decode_bytes_per_step(
                    self.base_engine, row["mean_context_tokens"], row["batch"]
                )
                gb_s = nbytes / (row["step_ms"] / 1e3) / 1e9
                shares.append({"batch": row["batch"], "bytes_per_step": nbytes,
                               "gb_per_s": float(f"{gb_s:.4g}"),
                               "share_of_copy": float(f"{gb_s / self.copy_gb_s:.3g}")})  # fmt: skip
            figures[mode] = shares
        return figures

    def ttft(self) -> Figures:
        if self.base_engine is None:
            raise Needs("decode_throughput", self.budget)
        return ttft_figures(self.base_engine, self.profile.ttft_prompt, self.profile.ttft_repeats)

    def transformers_generate(self) -> Figures:
        self._free("base_engine")  # the device to transformers alone
        if self.hf_model is None:
            raise Needs("serving_model", self.budget)
        p = self.profile
        vocab = self.hf_model.config.vocab_size
        rows = []
        for batch in p.hf_batches:
            try:
                rows.append(hf_decode(self.hf_model, batch, p.prompt_len, p.hf_steps, vocab))
            except Exception as error:
                rows.append({"batch": batch, "error": f"{type(error).__name__}: {error}"})
        engine = {r["batch"]: r for r in self.decode_rows.get("eager", []) if "error" not in r}
        for row in rows:
            if "error" not in row and row["batch"] in engine:
                row["engine_over_transformers"] = round(
                    engine[row["batch"]]["tokens_per_s"] / row["tokens_per_s"], 2
                )
        return {"rows": rows}

    def lora_batch(self) -> Figures:
        self._free("hf_model", "base_engine")
        if self.folder is None or not self.adapters:
            raise Needs("serving_model", self.budget)
        p, n = self.profile, len(self.adapters)
        self.lora_engine = self._engine(
            self.folder,
            enable_lora=True,
            max_loras=n,
            max_cpu_loras=n,
            max_lora_rank=16,
            max_num_seqs=n,
        )
        figures = lora_batch_figures(
            self.lora_engine, self.adapters, p.prompt_len, p.warm_steps, p.decode_steps
        )
        base = {r["batch"]: r for r in self.decode_rows.get("eager", []) if "error" not in r}
        if n in base:  # the base model on its own engine, LoRA off
            figures["base_engine"] = base[n]
            figures["ratio"] = round(figures["lora"]["tokens_per_s"] / base[n]["tokens_per_s"], 3)
        else:
            figures["ratio"] = figures["ratio_same_engine"]
        figures["goal"] = LORA_GOAL
        figures["meets_goal"] = figures["ratio"] >= LORA_GOAL
        return figures

    def lora_swap(self) -> Figures:
        if self.lora_engine is None:
            raise Needs("lora_batch", self.budget)
        try:
            return swap_in_figures(self.lora_engine, self.profile.swap_reps)
        finally:
            self._free("lora_engine")  # its slots were overwritten behind the manager's back

    # -- summary -----------------------------------------------------------------------------

    def goals(self) -> Figures:
        """The issue's pass/fail lines, None where their section did not finish."""

        def get(section: str, *keys: str) -> Any:
            value: Any = self.budget.sections.get(section, {})
            for key in keys:
                value = value.get(key) if isinstance(value, dict) else None
            return value

        return {
            "kernels_match_reference": get("kernels", "match_reference"),
            "greedy_matches_transformers": get("correctness", "correct"),
            "lora_ratio_at_least_0_85": get("lora_batch", "meets_goal"),
            "swap_p99_within_1_5x_plain_copy": get("lora_swap", "goal_within_1_5x"),
            "swap_p99_under_10_ms": get("lora_swap", "goal_under_10_ms"),
            "cuda_graphs": "measured" if len(engine_modes()) > 1 else "not built",
            # under --interpret the speed goals are read off a CPU: only the code ran
            "timings_meaningful": self.device.type == "cuda",
        }
