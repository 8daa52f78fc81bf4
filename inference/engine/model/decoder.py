"""The decoder-only transformer every served family is (Llama, Mistral, Qwen2/3, Gemma 2/3,
Phi-3), over a flat batch of tokens.

Tokens of all sequences in a step are laid back to back ([num_tokens, hidden]); which token
belongs to which sequence, and where its keys and values live, is in the ForwardContext.
What differs between families is a few switches in ModelConfig (see families.py). Module
names follow the Hugging Face checkpoints, except the merged `qkv_proj` and `gate_up_proj`
(see PACKED_MODULES), which Phi-3 checkpoints already store merged.
"""

import torch
import torch.nn.functional as F
from torch import nn

from ..model_config import ModelConfig
from ..parallel.plan import ShardPlan
from .attention import Attention
from .layers import Linear, VocabEmbedding
from .norm import RMSNorm
from .parallel_layers import ParallelLMHead, VocabParallelEmbedding
from .quantized_linear import make_column_parallel, make_linear, make_row_parallel
from .rotary import Rope, RotaryEmbedding, apply_rotary

# checkpoint projection -> (merged module, part index)
PACKED_MODULES = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
QKV = ["q_proj", "k_proj", "v_proj"]
GATE_UP = ["gate_proj", "up_proj"]


class SelfAttention(nn.Module):
    def __init__(self, mc: ModelConfig, layer: int, plan: ShardPlan | None = None):
        super().__init__()
        self.head_dim = mc.head_dim
        q_size, kv_size = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
        if plan is None:
            self.qkv_proj = make_linear(
                mc, layer, QKV, mc.hidden_size, [q_size, kv_size, kv_size], mc.qkv_bias
            )
            self.o_proj = make_linear(mc, layer, ["o_proj"], q_size, [mc.hidden_size], mc.o_bias)
        else:  # mc is this rank's shape (plan.local_config())
            full = plan.full
            full_sizes = [full.num_heads * mc.head_dim] + [full.num_kv_heads * mc.head_dim] * 2
            self.qkv_proj = make_column_parallel(
                mc, layer, QKV, mc.hidden_size, full_sizes, plan.qkv_rows(), mc.qkv_bias
            )
            self.o_proj = make_row_parallel(
                mc, layer, "o_proj", plan.o_columns(), mc.hidden_size, mc.o_bias, plan.rank,
                full.num_heads * mc.head_dim,
            )  # fmt: skip
        self.q_norm = self.k_norm = None
        if mc.qk_norm:
            self.q_norm = RMSNorm(mc.head_dim, mc.rms_norm_eps, mc.norm_offset)
            self.k_norm = RMSNorm(mc.head_dim, mc.rms_norm_eps, mc.norm_offset)
        self.attn = Attention(
            mc.num_heads,
            mc.num_kv_heads,
            mc.head_dim,
            scale=mc.attn_scale,
            window=mc.layer_windows[layer],
            softcap=mc.attn_softcap,
        )

    def forward(self, rope: Rope, x: torch.Tensor) -> torch.Tensor:
        q_size, kv_size, _ = self.qkv_proj.output_sizes
        qkv = self.qkv_proj(x)
        qk = qkv[:, : q_size + kv_size]
        if self.q_norm is not None and self.k_norm is not None:
            q, k = qk.split([q_size, kv_size], dim=-1)
            heads = (x.shape[0], -1, self.head_dim)
            qk = torch.cat(
                [
                    self.q_norm.norm(q.reshape(heads)).flatten(1),
                    self.k_norm.norm(k.reshape(heads)).flatten(1),
                ],
                dim=-1,
            )
        qk = apply_rotary(qk, rope, self.head_dim)  # queries and keys turn alike
        q, k = qk.split([q_size, kv_size], dim=-1)
        out: torch.Tensor = self.o_proj(self.attn(q, k, qkv[:, q_size + kv_size :]))
        return out


class GatedMLP(nn.Module):
    """down(act(gate) * up): SwiGLU, or GeGLU (tanh GELU) for Gemma."""

    def __init__(self, mc: ModelConfig, plan: ShardPlan | None = None, layer: int = 0):
        super().__init__()
        size = mc.intermediate_size
        if plan is None:
            self.gate_up_proj = make_linear(
                mc, layer, GATE_UP, mc.hidden_size, [size, size], mc.mlp_bias
            )
            self.down_proj = make_linear(
                mc, layer, ["down_proj"], size, [mc.hidden_size], mc.mlp_bias
            )
        else:
            full = [plan.full.intermediate_size] * 2
            self.gate_up_proj = make_column_parallel(
                mc, layer, GATE_UP, mc.hidden_size, full, plan.gate_up_rows(), mc.mlp_bias
            )
            self.down_proj = make_row_parallel(
                mc, layer, "down_proj", plan.down_columns(), mc.hidden_size, mc.mlp_bias,
                plan.rank, plan.full.intermediate_size,
            )  # fmt: skip
        self.gelu = mc.hidden_act == "gelu_pytorch_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        act = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        out: torch.Tensor = self.down_proj(act.mul_(up))
        return out


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP; with `sandwich_norms` (Gemma) each sublayer's output is
    normalised too before it joins the residual stream."""

    def __init__(self, mc: ModelConfig, layer: int, plan: ShardPlan | None = None):
        super().__init__()
        self.self_attn = SelfAttention(mc, layer, plan)
        self.mlp = GatedMLP(mc, plan, layer)
        eps, offset = mc.rms_norm_eps, mc.norm_offset
        self.input_layernorm = RMSNorm(mc.hidden_size, eps, offset)
        self.post_attention_layernorm = RMSNorm(mc.hidden_size, eps, offset)
        self.sandwich = mc.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = RMSNorm(mc.hidden_size, eps, offset)
            self.post_feedforward_layernorm = RMSNorm(mc.hidden_size, eps, offset)

    def forward(
        self, rope: Rope, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) in and out: the hidden state is their sum, which the next norm forms."""
        if residual is None:
            x, residual = self.input_layernorm.norm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(rope, x)
        if self.sandwich:
            x = self.post_attention_layernorm.norm(x)
            x, residual = self.pre_feedforward_layernorm(x, residual)
            return self.post_feedforward_layernorm.norm(self.mlp(x)), residual
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class DecoderModel(nn.Module):
    def __init__(self, mc: ModelConfig, max_positions: int, plan: ShardPlan | None = None):
        super().__init__()
        self.embed_tokens = (
            VocabEmbedding(mc.vocab_size, mc.hidden_size)
            if plan is None
            else VocabParallelEmbedding(plan.vocab_rows(), plan.vocab_per_rank, mc.hidden_size)
        )
        self.embed_scale = mc.embed_scale
        self.rotary = RotaryEmbedding(mc.rotary_dim, max_positions, mc.rope_theta, mc.rope_scaling)
        self.local_rotary = None  # Gemma 3's sliding layers turn at their own base frequency
        if mc.local_rope is not None:
            self.local_rotary = RotaryEmbedding(mc.rotary_dim, max_positions, *mc.local_rope)
        self.layers = nn.ModuleList(DecoderLayer(mc, i, plan) for i in range(mc.num_layers))
        self.sliding = [window is not None for window in mc.layer_windows]
        self.norm = RMSNorm(mc.hidden_size, mc.rms_norm_eps, mc.norm_offset)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        if self.embed_scale is not None:
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        rope = self.rotary(positions, x.dtype)  # the same angles serve every layer
        local = self.local_rotary(positions, x.dtype) if self.local_rotary else rope
        for layer, sliding in zip(self.layers, self.sliding, strict=True):
            x, residual = layer(local if sliding else rope, x, residual)
        hidden: torch.Tensor
        hidden, _ = self.norm(x, residual)
        return hidden


class CausalLM(nn.Module):
    """With a ShardPlan, this rank's shard of the model (tensor parallelism, parallel/):
    `mc` stays the whole model's shape; the plan gives each layer its part."""

    def __init__(self, mc: ModelConfig, max_positions: int, plan: ShardPlan | None = None):
        super().__init__()
        self.config = mc
        local = mc if plan is None else plan.local_config()
        self.model = DecoderModel(local, max_positions, plan)
        self.lm_head = (
            Linear(mc.hidden_size, [mc.vocab_size])
            if plan is None
            else ParallelLMHead(
                mc.hidden_size, plan.vocab_rows(), plan.vocab_per_rank, mc.vocab_size
            )
        )
        if mc.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states of every fed token; call `compute_logits` on the rows you sample."""
        hidden: torch.Tensor = self.model(input_ids, positions)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(hidden)
        cap = self.config.final_softcap
        if cap is not None:  # Gemma 2: tanh soft-capping keeps logits within (-cap, cap)
            logits = torch.tanh(logits / cap) * cap
        return logits
