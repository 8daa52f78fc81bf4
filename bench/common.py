"""Shared by the benchmarks: the command line, SmolLM2 (or --model), chat prompts, and for the
LoRA benchmarks rank-16 adapters on all seven projections made with PEFT.

Adapters are made once and cached under $LORAPLEX_VAR_DIR/bench-adapters (default var/):
one PEFT model wraps the base, and for each seed its LoRA factors are redrawn and saved
with `save_pretrained`, so every folder is a real PEFT adapter and the same seed always
gives the same bytes. A is drawn like PEFT's own init (uniform, std about 1/sqrt(in));
B, which training moves away from zero, gets a small normal draw (std 0.01), so each
adapter shifts the outputs as a trained one would rather than swamping them.
"""

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
B_STD = 0.01
FILLER = "Please be precise, use simple words, and give one concrete example. "


def bench_parser(doc: str, **options: int | float | bool) -> argparse.ArgumentParser:
    """--model, then one --option per keyword, typed by its default (a bool is a switch);
    the first line of the script's docstring describes it."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--model", help="Hugging Face model folder (default: bundled SmolLM2)")
    for name, default in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true")
        else:
            parser.add_argument(flag, type=type(default), default=default)
    return parser


def model_dir(arg: str | None) -> Path:
    if arg is not None:
        return Path(arg)
    from tests.smollm2 import smollm2_dir

    return smollm2_dir()


def make_adapters(base: Path, n: int, *, rank: int = 16, alpha: int = 32) -> list[Path]:
    """n adapters (seeds 0..n-1) for `base`, made on first use and reused after."""
    from tests.smollm2 import var_dir

    root = var_dir() / "bench-adapters" / f"{base.name}-r{rank}-a{alpha}-all"
    folders = [root / f"adapter-{i:03d}" for i in range(n)]
    todo = [i for i, f in enumerate(folders) if not (f / "adapter_model.safetensors").is_file()]
    if not todo:
        return folders
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=ALL_LINEAR, lora_dropout=0.0,
                        task_type="CAUSAL_LM")  # fmt: skip
    peft_model = get_peft_model(model, config)
    params = [(name, p) for name, p in peft_model.named_parameters() if "lora_" in name]
    for i in todo:
        generator = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for name, p in params:
                if "lora_A" in name:
                    bound = 3**0.5 / p.shape[1] ** 0.5  # uniform with std 1/sqrt(in)
                    p.copy_((torch.rand(p.shape, generator=generator) * 2 - 1) * bound)
                else:
                    p.copy_(torch.randn(p.shape, generator=generator) * B_STD)
        peft_model.save_pretrained(str(folders[i]))
        saved = json.loads((folders[i] / "adapter_config.json").read_text())
        saved["base_model_name_or_path"] = base.name
        (folders[i] / "adapter_config.json").write_text(json.dumps(saved, indent=2))
    return folders


TOPICS = [
    "the water cycle", "how a bicycle stays upright", "photosynthesis", "the French Revolution",
    "why the sky is blue", "compound interest", "how vaccines work", "the rules of chess",
    "plate tectonics", "how a compiler works", "the history of tea", "black holes",
    "how to bake bread", "the Roman aqueducts", "machine translation", "coral reefs",
]  # fmt: skip


def chat_prompts(
    tokenizer,
    n: int,
    filler: str = FILLER,
    repeats: Callable[[int], int] = lambda i: i % 2,
) -> list[list[int]]:
    """Chat-formatted questions as token ids: question i asks about a topic, then says
    `filler` repeats(i) times (by default 30 to ~80 tokens)."""
    prompts = []
    for i in range(n):
        question = f"Explain {TOPICS[i % len(TOPICS)]}. " + filler * repeats(i)
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}])
        prompts.append(tokenizer.encode(text))
    return prompts


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]
