"""Quantize tiny random models with llmcompressor, as the checkpoints people download are made.

Runs in the quantizing virtualenv (`.venv/quantize`, requirements-quantize.txt): llmcompressor
pins an older transformers than the project's, so it cannot live in the main venv. Usage:

    .venv/quantize/bin/python tests/quantized/make_checkpoints.py OUT_DIR

OUT_DIR gets one fp32 base per family (`<family>-base`, with the tests' tokenizer) and one
compressed-tensors folder per scheme below, and `manifest.json` naming them. The Llama
checkpoints are quantized from fp32 (fp32 scales: exact references), the Qwen2 ones from
bf16, as most published checkpoints are.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tests.quantized.shapes import BASES, make_base  # noqa: E402

BASE_DTYPES = {"llama": torch.float32, "qwen2": torch.bfloat16}
CALIBRATION_SAMPLES = 8
CALIBRATION_TOKENS = 32


def _weights(num_bits: int, strategy: str, group_size: int | None, symmetric: bool) -> dict:
    args: dict[str, Any] = {
        "num_bits": num_bits,
        "type": "int",
        "symmetric": symmetric,
        "strategy": strategy,
        "dynamic": False,
    }
    if group_size is not None:
        args["group_size"] = group_size
    return {"group_0": {"targets": ["Linear"], "weights": args}}


# name -> (family, modifier, modifier keywords, needs calibration data)
CHECKPOINTS: dict[str, tuple[str, str, dict[str, Any], bool]] = {
    "llama-fp8-dynamic": ("llama", "quantization", {"scheme": "FP8_DYNAMIC"}, False),
    # static activation scales need activations to observe
    "llama-fp8-static": ("llama", "quantization", {"scheme": "FP8"}, True),
    "llama-w4a16": ("llama", "quantization", {"scheme": "W4A16"}, False),
    "llama-w4a16-asym": ("llama", "quantization", {"scheme": "W4A16_ASYM"}, False),
    "llama-w8a16": ("llama", "quantization", {"scheme": "W8A16"}, False),
    "llama-w4a16-channel": (
        "llama",
        "quantization",
        {"config_groups": _weights(4, "channel", None, True)},
        False,
    ),
    "llama-w4a16-g32-asym": (
        "llama",
        "quantization",
        {"config_groups": _weights(4, "group", 32, False)},
        False,
    ),
    "llama-w8a16-g64-asym": (
        "llama",
        "quantization",
        {"config_groups": _weights(8, "group", 64, False)},
        False,
    ),
    # GPTQ with activation ordering ("weight": columns visited by activation size; the saved
    # format is that of plain W4A16, with no g_idx, since compressed-tensors 0.19 dropped
    # the "group" ordering that stored one)
    "llama-w4a16-gptq-actorder": (
        "llama",
        "gptq",
        {"scheme": "W4A16", "actorder": "weight", "block_size": 128},
        True,
    ),
    "qwen2-fp8-dynamic": ("qwen2", "quantization", {"scheme": "FP8_DYNAMIC"}, False),
    "qwen2-w4a16-g64": (
        "qwen2",
        "quantization",
        {"config_groups": _weights(4, "group", 64, True)},
        False,
    ),
    "qwen2-w4a16-g64-asym": (
        "qwen2",
        "quantization",
        {"config_groups": _weights(4, "group", 64, False)},
        False,
    ),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def calibration_set(vocab_size: int, seed: int = 0) -> Any:
    """Random token ids: enough for observers and GPTQ's Hessians on a random model."""
    from datasets import Dataset  # type: ignore[import-untyped]

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(
        3, vocab_size, (CALIBRATION_SAMPLES, CALIBRATION_TOKENS), generator=generator
    )
    return Dataset.from_dict(
        {"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist()}
    )


def quantize(base: Path, out: Path, modifier: str, kwargs: dict[str, Any], calibrate: bool,
             dtype: torch.dtype) -> None:  # fmt: skip
    # only in the quantizing venv
    from llmcompressor import oneshot  # type: ignore[import-not-found]
    from llmcompressor.modifiers.quantization import (  # type: ignore[import-not-found]
        GPTQModifier,
        QuantizationModifier,
    )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype)
    cls = GPTQModifier if modifier == "gptq" else QuantizationModifier
    recipe = cls(targets="Linear", ignore=["lm_head"], **kwargs)
    extra: dict[str, Any] = {}
    if calibrate:
        extra = {
            "dataset": calibration_set(model.config.vocab_size),
            "num_calibration_samples": CALIBRATION_SAMPLES,
            "max_seq_length": CALIBRATION_TOKENS,
        }
    torch.manual_seed(0)
    oneshot(model=model, recipe=recipe, **extra)
    model.save_pretrained(str(out), save_compressed=True)
    for name in TOKENIZER_FILES:
        shutil.copy(base / name, out / name)


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    bases = {family: make_base(out_dir, family) for family in BASES}
    manifest: dict[str, Any] = {"bases": {f: p.name for f, p in bases.items()}, "checkpoints": {}}
    for name, (family, modifier, kwargs, calibrate) in CHECKPOINTS.items():
        quantize(bases[family], out_dir / name, modifier, kwargs, calibrate, BASE_DTYPES[family])
        manifest["checkpoints"][name] = {
            "family": family,
            "base": bases[family].name,
            "dtype": str(BASE_DTYPES[family]).removeprefix("torch."),
            "modifier": modifier,
            "recipe": kwargs,
            "calibrated": calibrate,
        }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
