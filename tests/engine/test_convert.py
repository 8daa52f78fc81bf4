"""The GGUF converter: faithful weights, deterministic bytes, clean failures."""

from __future__ import annotations

import hashlib
import json
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from inference.engine.formats.convert import (
    OUTPUT_FILES,
    ConvertError,
    convert_gguf,
    ensure_converted,
    preset_gguf_path,
    unpermute_rotary_rows,
)
from tests.smollm2 import GGUF_NAME, PRESET, smollm2_dir

REPO = Path(__file__).resolve().parents[2]


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to q/k rows: interleave each head's two halves."""
    rows, cols = weight.shape
    half = rows // num_heads // 2
    order = [
        h * 2 * half + k * half + j for h in range(num_heads) for j in range(half) for k in (0, 1)
    ]
    return weight[order]


def write_tiny_gguf(path: Path, arch: str = "llama", tokenizer_model: str = "gpt2") -> dict:
    """A 2-layer llama GGUF with random fp32 weights; returns the weights in Hugging Face layout."""
    import gguf

    rng = np.random.default_rng(0)
    hidden, heads, kv_heads, ffn, layers = 16, 4, 2, 32, 2
    head_dim = hidden // heads
    byte_tokens = [chr(c) for c in range(33, 127)]  # printable ASCII is its own byte-level spelling
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *byte_tokens, "he", "ll"]
    types = [3, 3, 3] + [1] * (len(tokens) - 3)
    vocab = len(tokens)

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    hf = {"model.embed_tokens.weight": rand(vocab, hidden), "model.norm.weight": rand(hidden)}
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(layers)
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["h e", "l l"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    writer.add_tensor("token_embd.weight", hf["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", hf["model.norm.weight"])
    for i in range(layers):
        layer = {
            "attn_norm": ("input_layernorm", rand(hidden)),
            "ffn_norm": ("post_attention_layernorm", rand(hidden)),
            "attn_q": ("self_attn.q_proj", rand(heads * head_dim, hidden)),
            "attn_k": ("self_attn.k_proj", rand(kv_heads * head_dim, hidden)),
            "attn_v": ("self_attn.v_proj", rand(kv_heads * head_dim, hidden)),
            "attn_output": ("self_attn.o_proj", rand(hidden, hidden)),
            "ffn_gate": ("mlp.gate_proj", rand(ffn, hidden)),
            "ffn_up": ("mlp.up_proj", rand(ffn, hidden)),
            "ffn_down": ("mlp.down_proj", rand(hidden, ffn)),
        }
        for gguf_name, (hf_name, weight) in layer.items():
            hf[f"model.layers.{i}.{hf_name}.weight"] = weight
            if gguf_name == "attn_q":
                weight = llama_cpp_permute(weight, heads)
            elif gguf_name == "attn_k":
                weight = llama_cpp_permute(weight, kv_heads)
            writer.add_tensor(f"blk.{i}.{gguf_name}.weight", weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hf


def hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "inference.engine.formats.convert", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- the bundled SmolLM2 ------------------------------------------------------------------------


@pytest.mark.slow
def test_converted_smollm2_logits_equal_transformers_gguf_load():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    folder = smollm2_dir()
    gguf_path = preset_gguf_path(PRESET)
    ours = LlamaForCausalLM.from_pretrained(folder).eval()
    reference = LlamaForCausalLM.from_pretrained(gguf_path.parent, gguf_file=GGUF_NAME).eval()
    ids = torch.tensor([[1, 4093, 9543, 284, 4649, 314, 2]])  # arbitrary ids incl. specials
    with torch.no_grad():
        diff = (ours(ids).logits - reference(ids).logits).abs().max().item()
    assert diff < 1e-4


def test_converted_smollm2_folder_has_config_tensors_and_modes():
    from safetensors import safe_open

    folder = smollm2_dir()
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["head_dim"]) == (30, 576, 64)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
    assert config["rope_theta"] == 100000.0 and config["rms_norm_eps"] == 1e-5
    assert config["eos_token_id"] == 2 and config["torch_dtype"] == "float32"
    with safe_open(folder / "model.safetensors", framework="numpy") as f:
        names = set(f.keys())
        assert f.get_slice("model.layers.0.self_attn.k_proj.weight").get_shape() == [192, 576]
        assert f.get_slice("model.embed_tokens.weight").get_dtype() == "F32"
    assert "lm_head.weight" not in names
    assert len(names) == 2 + 30 * 9
    for name in OUTPUT_FILES:
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o644


def test_ensure_converted_reuses_a_complete_folder():
    folder = smollm2_dir()
    before = (folder / "model.safetensors").stat().st_mtime_ns
    assert ensure_converted(PRESET, folder) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == before


@pytest.mark.slow
def test_converting_twice_gives_identical_bytes(tmp_path):
    gguf_path = preset_gguf_path(PRESET)
    first = convert_gguf(gguf_path, tmp_path / "a")
    second = convert_gguf(gguf_path, tmp_path / "b")
    assert hashes(first) == hashes(second)
    assert sorted(hashes(first)) == sorted(OUTPUT_FILES)


# --- a tiny synthetic GGUF ---------------------------------------------------------------------


def test_unpermute_inverts_llama_cpp_permutation():
    weight = np.arange(8 * 4 * 3, dtype=np.float32).reshape(8 * 4, 3)
    for heads in (1, 2, 4):
        np.testing.assert_array_equal(
            unpermute_rotary_rows(llama_cpp_permute(weight, heads), heads), weight
        )


def test_tiny_gguf_converts_through_cli_with_hf_layout(tmp_path):
    from safetensors.numpy import load_file

    expected = write_tiny_gguf(tmp_path / "tiny.gguf")
    result = run_cli("--gguf", str(tmp_path / "tiny.gguf"), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    weights = load_file(tmp_path / "out" / "model.safetensors")
    assert set(weights) == set(expected)
    for name, weight in expected.items():
        np.testing.assert_array_equal(weights[name], weight, err_msg=name)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["num_key_value_heads"], config["head_dim"], config["vocab_size"]) == (2, 4, 99)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tiny.gguf"]  # no temp leftovers


def test_concurrent_conversions_into_one_folder_leave_one_complete_copy(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    out, outcomes = tmp_path / "out", []

    def convert():
        try:
            convert_gguf(tmp_path / "tiny.gguf", out)
            outcomes.append("ok")
        except ConvertError:
            outcomes.append("refused")

    threads = [threading.Thread(target=convert) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("ok") == 1 and outcomes.count("refused") == 2
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_FILES)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tiny.gguf"]


def test_existing_folder_is_kept_unless_overwrite_is_asked(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConvertError, match="already exists"):
        convert_gguf(tmp_path / "tiny.gguf", out)
    assert (out / "keep.txt").read_text() == "mine"
    convert_gguf(tmp_path / "tiny.gguf", out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_FILES)


# --- errors: exit 2, a message, nothing written ------------------------------------------------


def test_cli_unknown_preset_exits_2_and_writes_nothing(tmp_path):
    result = run_cli("--preset", "llama-9000", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "unknown preset 'llama-9000'" in result.stderr and PRESET in result.stderr
    assert not (tmp_path / "out").exists()


def test_cli_missing_gguf_exits_2_and_writes_nothing(tmp_path):
    result = run_cli("--gguf", str(tmp_path / "absent.gguf"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "GGUF file not found" in result.stderr
    assert not (tmp_path / "out").exists()


def test_cli_non_gguf_file_exits_2_and_writes_nothing(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"PK\x03\x04 this is a zip, not a gguf")
    result = run_cli("--gguf", str(tmp_path / "model.gguf"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "is not a GGUF file" in result.stderr
    assert not (tmp_path / "out").exists()


def test_cli_gguf_of_another_architecture_exits_2_and_writes_nothing(tmp_path):
    write_tiny_gguf(tmp_path / "gpt2.gguf", arch="gpt2")
    result = run_cli("--gguf", str(tmp_path / "gpt2.gguf"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "'gpt2' model" in result.stderr and "'llama'" in result.stderr
    assert not (tmp_path / "out").exists()


def test_sentencepiece_tokenizer_is_refused_before_writing(tmp_path):
    write_tiny_gguf(tmp_path / "spm.gguf", tokenizer_model="llama")
    with pytest.raises(ConvertError, match="tokenizer model 'llama'"):
        convert_gguf(tmp_path / "spm.gguf", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm.gguf"]


def test_cli_needs_exactly_one_source(tmp_path):
    result = run_cli("--preset", PRESET, "--gguf", "x.gguf", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "not allowed with argument" in result.stderr
    assert not (tmp_path / "out").exists()
