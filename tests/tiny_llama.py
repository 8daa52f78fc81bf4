"""A tiny random Llama saved as a Hugging Face folder, with a real byte-level BPE tokenizer.

Shared by the engine tests and the LoRA tests: the folder looks exactly like a downloaded
checkpoint (config.json, model.safetensors, tokenizer.json, tokenizer_config.json with a
ChatML template), so every loading path is the real one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# ChatML with tools in Hermes/Qwen's layout: the tools listed in the system turn (by name
# alone, which keeps prompts short for the tiny model's 512-token context), calls and their
# results written the way those models answer: `<tool_call>{"name", "arguments"}</tool_call>`.
TOOLS_CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\\n' }}{% endif %}"
    "{{ '<tools>' }}"
    "{% for tool in tools %}{{ ' ' + tool['function']['name'] }}{% endfor %}"
    "{{ ' </tools><|im_end|>\\n' }}"
    "{% endif %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message['content'] + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{% elif not (loop.first and tools and message['role'] == 'system') %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{{ '<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' + "
    "call['function']['arguments'] | tojson + '}\\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "A language model predicts the next token from the tokens before it.",
    "Many tenants share one base model; each brings a small adapter of its own.",
    "Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000, and punctuation: ; , . ! ? ( ) [ ] { }",
    "Héllo wörld, naïve café, 日本語, emoji 🙂 and symbols ∑ ∞.",
]


def build_tokenizer(vocab_size: int = 384) -> Tokenizer:
    """Byte-level BPE trained on a few sentences: any text encodes, common words merge."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    return tokenizer


def make_tiny_llama(
    path: str | Path,
    *,
    num_layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    tie: bool = True,
    vocab: int | None = None,
    max_positions: int = 512,
    rope_theta: float = 10000.0,
    rope_scaling: dict | None = None,
    architecture: str = "LlamaForCausalLM",
    init_std: float = 0.1,
    seed: int = 0,
) -> Path:
    """Save a seeded random fp32 model and its tokenizer in `path`; return the folder.

    `vocab` defaults to the tokenizer's size; a larger value pads the model's vocabulary as
    real checkpoints often do. `rope_scaling` is a transformers rope dict without the theta,
    e.g. {"rope_type": "llama3", "factor": 8.0, ...}. `init_std` above the transformers
    default makes next-token distributions peaked, so greedy choices are far from ties.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save(str(path / "tokenizer.json"))
    vocab = vocab or tokenizer.get_vocab_size()
    assert vocab >= tokenizer.get_vocab_size(), "the model vocabulary must cover the tokenizer"
    config_cls, model_cls = {
        "LlamaForCausalLM": (LlamaConfig, LlamaForCausalLM),
        "MistralForCausalLM": (MistralConfig, MistralForCausalLM),
    }[architecture]
    config = config_cls(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        rope_parameters={"rope_type": "default", **(rope_scaling or {}), "rope_theta": rope_theta},
        tie_word_embeddings=tie,
        initializer_range=init_std,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    model.save_pretrained(path)
    write_tokenizer_config(path, max_positions)
    return path


def write_tokenizer_config(path: Path, max_positions: int) -> None:
    """tokenizer_config.json with the ChatML template, as SmolLM2 ships it."""
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "pad_token": "<|im_end|>",
                "unk_token": "<|endoftext|>",
                "model_max_length": max_positions,
                "chat_template": CHATML_TEMPLATE,
            },
            indent=2,
        )
    )
