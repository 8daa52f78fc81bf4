"""Shared pieces of the LoRA engine tests: a tiny Llama, real PEFT adapters for it, and
helpers that run an engine to completion."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from inference.engine import LLMEngine, LoRARequest, SamplingParams
from tests.peft_adapters import CONFIG_FILE, WEIGHTS_FILE, make_peft_adapter
from tests.tiny_llama import make_tiny_llama

ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = [
    "The quick brown fox",
    "Paris is the capital",
    "Many tenants share one base model; each brings a small adapter of its own.",
    "Numbers 0 1 2 3",
    "Héllo wörld 🙂",
]


@pytest.fixture(scope="session")
def lora_model_dir(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("lora-tiny"), num_layers=2)


@pytest.fixture(scope="session")
def adapters(lora_model_dir, tmp_path_factory):
    """adapters(name, **make_peft_adapter kwargs) -> folder; made once per session and name."""
    root = tmp_path_factory.mktemp("adapters")
    made: dict[str, Path] = {}

    def make(name: str, **kwargs) -> Path:
        if name not in made:
            kwargs.setdefault("seed", len(made) + 1)
            made[name] = make_peft_adapter(lora_model_dir, root / name, **kwargs)
        return made[name]

    return make


def lora_engine(model_dir, **kwargs) -> LLMEngine:
    kwargs.setdefault("kv_cache_bytes", 4 << 20)
    kwargs.setdefault("block_size", 4)
    return LLMEngine(model=model_dir, enable_lora=True, **kwargs)


def request_for(name: str, path) -> LoRARequest:
    return LoRARequest(name, f"id-{name}", str(path) if path is not None else None)


def run_all(engine: LLMEngine, max_steps: int = 10_000) -> dict:
    """Step until idle; {request id: output fields gathered over the stream}."""
    results: dict[str, dict] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return results
        steps = engine.num_steps
        outputs = engine.step()
        if not outputs and engine.num_steps == steps:  # nothing ran: adapters are loading
            engine.wait_for_load(0.05)
        for out in outputs:
            r = results.setdefault(out.request_id, {"tokens": [], "finish": None, "error": None})
            r["tokens"] += out.new_token_ids
            r["finish"], r["error"] = out.finish_reason, out.error
    raise AssertionError("the engine did not finish")


def corrupt(src: Path, dst: Path, *, config=None, tensors=None) -> Path:
    """A copy of an adapter with its config and/or tensors edited by the given functions."""
    shutil.copytree(src, dst)
    if config is not None:
        raw = json.loads((dst / CONFIG_FILE).read_text())
        config(raw)
        (dst / CONFIG_FILE).write_text(json.dumps(raw))
    if tensors is not None:
        weights = load_file(dst / WEIGHTS_FILE)
        tensors(weights)
        save_file(weights, dst / WEIGHTS_FILE)
    return dst


def first_key(weights: dict, part: str) -> str:
    return next(k for k in sorted(weights) if part in k)
