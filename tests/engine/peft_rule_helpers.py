"""Shared pieces of the PEFT rule tests: real PEFT adapters for tiny models built from a
config (nothing saved but the adapter), header-only reports, and edits of adapter files."""

import json

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from inference.engine.formats.safetensors_header import parse_header
from inference.engine.lora.peft_rules import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    check_adapter,
    fingerprint_from_config,
)
from tests.tiny_models import FAMILIES

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL_LINEAR = ATTENTION + ["gate_proj", "up_proj", "down_proj"]
BASE_NAME = "tiny/llama-test"
MAX_RANK = 16


def tiny_config(**overrides) -> LlamaConfig:
    dims = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=256,
    )
    return LlamaConfig(**(dims | overrides))


def family_model(family: str):
    """(a tiny random transformers model of `family`, its fingerprint), no files."""
    import transformers

    config_name, model_name, kwargs = FAMILIES[family]
    dims = {
        "vocab_size": 384,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "pad_token_id": None,
    }
    config = getattr(transformers, config_name)(
        **(dims | {"num_attention_heads": 4, "num_key_value_heads": 2} | kwargs)
    )
    config.architectures = [model_name]
    return getattr(transformers, model_name)(config), fingerprint_from_config(config.to_dict())


def make_adapter(folder, seed=0, model=None, **lora):
    """Save a real PEFT adapter with random trained tensors (PEFT starts B at zero) for
    `model` (default: a fresh tiny Llama of `tiny_config`)."""
    torch.manual_seed(seed)
    model = get_peft_model(model or LlamaForCausalLM(tiny_config()), LoraConfig(**lora))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(std=0.1)
    model.save_pretrained(folder)
    config = json.loads((folder / CONFIG_FILE).read_text())  # set after saving: PEFT would
    config["base_model_name_or_path"] = BASE_NAME  # try to fetch this name from the hub
    (folder / CONFIG_FILE).write_text(json.dumps(config))
    return model


def report_for(folder, fingerprint, **kw):
    kw = {"max_lora_rank": MAX_RANK, "expected_base_name": BASE_NAME} | kw
    config = (folder / CONFIG_FILE).read_bytes()
    header = parse_header(folder / WEIGHTS_FILE)
    return check_adapter(config, header, fingerprint, weights_path=folder / WEIGHTS_FILE, **kw)


def failed(report) -> dict[str, str]:
    assert not report.ok and report.spec is None
    return {c.name: c.message for c in report.failures}


def mutate(good, tmp_path, config=None, tensors=None):
    """A copy of the good adapter with config fields replaced and tensors rewritten."""
    folder = tmp_path / "mutated"
    folder.mkdir()
    cfg = json.loads((good / CONFIG_FILE).read_text()) | (config or {})
    (folder / CONFIG_FILE).write_text(json.dumps(cfg))
    weights = load_file(good / WEIGHTS_FILE)
    if tensors is not None:
        weights = tensors(weights)
    save_file(weights, folder / WEIGHTS_FILE, metadata={"format": "pt"})
    return folder


def rename(old: str, new: str):
    return lambda w: {k.replace(old, new): v for k, v in w.items()}


KEY = "base_model.model.model.layers.{}.self_attn.{}.lora_{}.weight"
