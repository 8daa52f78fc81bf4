"""Llama (and Mistral, SmolLM: same graph) over a flat batch of tokens.

Tokens of all sequences in a step are laid back to back ([num_tokens, hidden]); which token
belongs to which sequence, and where its keys and values live, is in the ForwardContext.
Module names follow the Hugging Face checkpoints, except the merged `qkv_proj` and
`gate_up_proj` (see PACKED_MODULES).
"""

import torch
from torch import nn

from ..config import ModelConfig
from .attention import Attention
from .layers import Linear, RMSNorm, RotaryEmbedding, SiluAndMul, VocabEmbedding, apply_rotary

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin) of the batch's positions

# checkpoint projection -> (merged module, part index)
PACKED_MODULES = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaAttention(nn.Module):
    def __init__(self, mc: ModelConfig):
        super().__init__()
        q_size, kv_size = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
        self.qkv_proj = Linear(mc.hidden_size, [q_size, kv_size, kv_size], bias=mc.attention_bias)
        self.o_proj = Linear(q_size, [mc.hidden_size], bias=mc.attention_bias)
        self.attn = Attention(mc.num_heads, mc.num_kv_heads, mc.head_dim)

    def forward(self, rope: Rope, x: torch.Tensor) -> torch.Tensor:
        q_size, kv_size, _ = self.qkv_proj.output_sizes
        qkv = self.qkv_proj(x)
        qk = apply_rotary(qkv[:, : q_size + kv_size], rope)  # queries and keys turn alike
        q, k = qk.split([q_size, kv_size], dim=-1)
        out: torch.Tensor = self.o_proj(self.attn(q, k, qkv[:, q_size + kv_size :]))
        return out


class LlamaMLP(nn.Module):
    def __init__(self, mc: ModelConfig):
        super().__init__()
        size = mc.intermediate_size
        self.gate_up_proj = Linear(mc.hidden_size, [size, size], bias=mc.mlp_bias)
        self.down_proj = Linear(size, [mc.hidden_size], bias=mc.mlp_bias)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(self.act(self.gate_up_proj(x)))
        return out


class LlamaDecoderLayer(nn.Module):
    def __init__(self, mc: ModelConfig):
        super().__init__()
        self.self_attn = LlamaAttention(mc)
        self.mlp = LlamaMLP(mc)
        self.input_layernorm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)

    def forward(
        self, rope: Rope, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(rope, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, mc: ModelConfig, max_positions: int):
        super().__init__()
        self.embed_tokens = VocabEmbedding(mc.vocab_size, mc.hidden_size)
        self.rotary = RotaryEmbedding(mc.head_dim, max_positions, mc.rope_theta, mc.rope_scaling)
        self.layers = nn.ModuleList(LlamaDecoderLayer(mc) for _ in range(mc.num_layers))
        self.norm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        rope = self.rotary(positions, x.dtype)  # the same angles serve every layer
        for layer in self.layers:
            x, residual = layer(rope, x, residual)
        hidden: torch.Tensor
        hidden, _ = self.norm(x, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    def __init__(self, mc: ModelConfig, max_positions: int):
        super().__init__()
        self.config = mc
        self.model = LlamaModel(mc, max_positions)
        self.lm_head = Linear(mc.hidden_size, [mc.vocab_size])
        if mc.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states of every fed token; call `compute_logits` on the rows you sample."""
        hidden: torch.Tensor = self.model(input_ids, positions)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(hidden)
        return logits
