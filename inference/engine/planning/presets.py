"""Models the planner knows by name, as the config.json their checkpoints ship (the numbers
that size weights, KV cache and adapters; the engine reads them as it reads any config)."""

from typing import Any


def _llama(**dims: Any) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "vocab_size": 128256,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        **dims,
    }


def _qwen2(**dims: Any) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
        "sliding_window": 131072,
        "use_sliding_window": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        **dims,
    }


PRESETS: dict[str, dict[str, Any]] = {
    "llama-3-8b": _llama(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=8192,
    ),
    "llama-3-70b": _llama(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=8192,
    ),
    "llama-3.1-405b": _llama(
        hidden_size=16384,
        intermediate_size=53248,
        num_hidden_layers=126,
        num_attention_heads=128,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "qwen2.5-7b": _qwen2(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    ),
    "qwen2.5-72b": _qwen2(
        hidden_size=8192,
        intermediate_size=29568,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    ),
    "mistral-7b": {
        "architectures": ["MistralForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 32768,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-5,
        "sliding_window": None,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "gemma-2-27b": {
        "architectures": ["Gemma2ForCausalLM"],
        "hidden_size": 4608,
        "intermediate_size": 36864,
        "num_hidden_layers": 46,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": 144,
        "sliding_window": 4096,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
    },
}
