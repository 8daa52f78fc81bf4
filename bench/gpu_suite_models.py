"""Random-weight Llama models and PEFT adapters for the GPU suite, made on the device.

Nothing is downloaded: a transformers LlamaConfig with the wanted shape is instantiated
directly on the device in the serving dtype (seeded random weights), saved as a Hugging
Face folder with a word-level tokenizer of one made-up word per id (a random model may emit
any id, and the engine detokenizes each), and the same in-memory model stays the
transformers reference.
Adapters are real PEFT saves: LoRA layers are injected into that model, redrawn per seed and
saved, then unloaded again, leaving the base model as it was.
"""

from pathlib import Path
from typing import Any

import torch
from common import ALL_LINEAR, B_STD

# Llama-3-8B's shape (rope as Llama 3.1 ships it), with a context cut to what the suite uses.
LLAMA3_8B: dict[str, Any] = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": False,
}


def llama_shape(
    hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int, max_pos: int
) -> dict[str, Any]:
    """A smaller Llama-3-like shape (GQA, llama3 rope) for correctness and --interpret."""
    rope = dict(LLAMA3_8B["rope_parameters"], original_max_position_embeddings=max_pos // 2)
    return {
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "max_position_embeddings": max_pos,
        "rope_parameters": rope,
        "tie_word_embeddings": False,
    }


def build_random_llama(
    folder: Path,
    shape: dict[str, Any],
    *,
    device: torch.device,
    dtype: torch.dtype,
    init_std: float,
    seed: int = 0,
) -> torch.nn.Module:
    """Save a seeded random Llama of `shape` in `folder` and return it (on `device`, eval).

    `init_std` above transformers' 0.02 makes next-token choices peaked, so greedy
    comparisons meet fewer near-ties."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.tiny_llama import write_tokenizer_config

    folder.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(
        **shape, initializer_range=init_std, bos_token_id=1, eos_token_id=2, pad_token_id=None
    )
    torch.manual_seed(seed)
    from inference.engine.utils import default_dtype

    with torch.device(device), default_dtype(dtype):
        model = LlamaForCausalLM(config)
    model.eval()
    model.save_pretrained(folder)
    word_tokenizer(shape["vocab_size"]).save(str(folder / "tokenizer.json"))
    write_tokenizer_config(folder, shape["max_position_embeddings"])
    return model


def word_tokenizer(vocab_size: int) -> Any:
    """ChatML's three special tokens (ids 0-2, as the tests' tokenizer has them), then the
    words w3 .. w<vocab_size - 1>: every id the model can emit decodes."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {token: i for i, token in enumerate(specials)}
    vocab.update({f"w{i}": i for i in range(len(specials), vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=specials[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(specials)
    return tokenizer


def write_random_adapters(
    model: torch.nn.Module, root: Path, count: int, *, rank: int = 16, alpha: int = 32
) -> tuple[torch.nn.Module, list[Path]]:
    """`count` rank-`rank` PEFT adapters on all seven projections of `model`, seeds 0..count-1,
    A drawn like PEFT's init and B small (as bench/common.py draws them). Returns the base
    model (PEFT's layers removed again) and the adapter folders."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=ALL_LINEAR, lora_dropout=0.0,
                        task_type="CAUSAL_LM")  # fmt: skip
    # autocast off: the factors stay in the model's dtype, as a bf16 training run saves them
    peft_model = get_peft_model(model, config, autocast_adapter_dtype=False)
    params = [(name, p) for name, p in peft_model.named_parameters() if "lora_" in name]
    device = params[0][1].device
    folders = []
    for i in range(count):
        generator = torch.Generator(device=device).manual_seed(i)
        with torch.no_grad():
            for name, p in params:
                if "lora_A" in name:
                    bound = 3**0.5 / p.shape[1] ** 0.5  # uniform with std 1/sqrt(in)
                    draw = torch.rand(p.shape, generator=generator, device=device) * 2 - 1
                    p.copy_(draw * bound)
                else:
                    p.copy_(torch.randn(p.shape, generator=generator, device=device) * B_STD)
        folder = root / f"adapter-{i:03d}"
        peft_model.save_pretrained(str(folder))
        folders.append(folder)
    base = peft_model.unload()
    return base, folders


def param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())
