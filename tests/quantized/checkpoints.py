"""Build the quantized test checkpoints once and keep them under the test var dir.

Two sets, each in a folder named by a hash of the code that makes it, so editing that code
makes a fresh set and an unchanged checkout reuses its own:

- compressed: llmcompressor's compressed-tensors folders (make_checkpoints.py, run in the
  quantizing venv the Makefile installs at `<venv>/quantize`);
- packed: AutoAWQ and GPTQ folders from our own packer (awq_gptq_pack.py), with their fp32
  dequantized references, and PEFT adapters for the bases (both made in this venv).

Each set is built in a private folder and renamed into place, so concurrent test processes
never see half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.fresh_python import ROOT
from tests.smollm2 import var_dir

HERE = Path(__file__).resolve().parent
QUANTIZE_VENV = Path(sys.prefix, "quantize")
QUANTIZE_STAMP = QUANTIZE_VENV / ".installed"
SHARED_SOURCES = (HERE / "shapes.py", ROOT / "tests/tiny_models.py", ROOT / "tests/tiny_llama.py")
COMPRESSED_SOURCES = (
    *SHARED_SOURCES,
    HERE / "make_checkpoints.py",
    ROOT / "requirements-quantize.txt",
)
PACKED_SOURCES = (*SHARED_SOURCES, HERE / "awq_gptq_pack.py", ROOT / "tests/peft_adapters.py")
# folder name -> (format, desc_act); all group 128, from the Llama base
PACKED = {
    "llama-awq-gemm-g128": ("awq", False),
    "llama-gptq-g128": ("gptq", False),
    "llama-gptq-g128-desc-act": ("gptq", True),
}
ADAPTER_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class CompressedCheckpoints:
    """`bases`: family -> fp32 base; `folders`: name -> compressed-tensors folder;
    `manifest`: name -> {family, base, dtype, modifier, recipe, calibrated}."""

    root: Path
    bases: dict[str, Path]
    folders: dict[str, Path]
    manifest: dict[str, dict] = field(default_factory=dict)


@dataclass
class PackedCheckpoints:
    """`folders`: name -> AWQ/GPTQ folder; `references`: name -> its fp32 dequantized twin;
    `adapters`: family -> a PEFT LoRA adapter on every projection of that base."""

    root: Path
    bases: dict[str, Path]
    folders: dict[str, Path]
    references: dict[str, Path]
    adapters: dict[str, Path]


def source_key(paths: tuple[Path, ...]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _build_once(target: Path, build) -> Path:
    """`target`, built by `build(folder)` unless it exists; sets of older keys are removed."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        build(scratch)
        os.rename(scratch, target)
    except OSError:
        if not target.is_dir():  # not lost to a concurrent build: a real failure
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    kind = target.name.rsplit("-", 1)[0]
    for stale in target.parent.glob(f"{kind}-*"):
        if stale != target and "." not in stale.name:
            shutil.rmtree(stale, ignore_errors=True)
    return target


def compressed_checkpoints() -> CompressedCheckpoints:
    """Run make_checkpoints.py in the quantizing venv (once per source key)."""

    def build(scratch: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        command = [str(QUANTIZE_VENV / "bin" / "python"), str(HERE / "make_checkpoints.py")]
        done = subprocess.run(
            [*command, str(scratch)], cwd=ROOT, env=env, capture_output=True, text=True
        )
        if done.returncode:
            raise RuntimeError(f"make_checkpoints.py failed:\n{done.stderr[-4000:]}")

    root = _build_once(
        var_dir() / "quantized" / f"compressed-{source_key(COMPRESSED_SOURCES)}", build
    )
    manifest = json.loads((root / "manifest.json").read_text())
    return CompressedCheckpoints(
        root=root,
        bases={family: root / name for family, name in manifest["bases"].items()},
        folders={name: root / name for name in manifest["checkpoints"]},
        manifest=manifest["checkpoints"],
    )


def packed_checkpoints() -> PackedCheckpoints:
    """Pack the Llama base as AWQ and GPTQ and make the adapters (once per source key)."""
    from tests.peft_adapters import make_peft_adapter
    from tests.quantized.awq_gptq_pack import write_packed
    from tests.quantized.shapes import BASES, make_base

    def build(scratch: Path) -> None:
        for family in BASES:
            base = make_base(scratch, family)
            make_peft_adapter(
                base,
                scratch / f"{family}-lora",
                targets=ADAPTER_TARGETS,
                seed=3,
                base_model_name=base.name,
            )
        for name, (fmt, desc_act) in PACKED.items():
            write_packed(scratch / "llama-base", scratch / name, fmt, desc_act=desc_act)

    root = _build_once(var_dir() / "quantized" / f"packed-{source_key(PACKED_SOURCES)}", build)
    return PackedCheckpoints(
        root=root,
        bases={family: root / f"{family}-base" for family in ("llama", "qwen2")},
        folders={name: root / name for name in PACKED},
        references={name: root / f"{name}-dequantized" for name in PACKED},
        adapters={family: root / f"{family}-lora" for family in ("llama", "qwen2")},
    )
