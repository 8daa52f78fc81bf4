"""Rotary position embedding: the angle table and the rotation of queries and keys."""

import math
from typing import Any

import torch
from torch import nn

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin) of a batch's positions


def rope_inv_freq(
    dim: int, theta: float, scaling: dict[str, Any] | None, max_positions: int
) -> torch.Tensor:
    """Inverse frequencies of rotary embedding over `dim` rotated dims, with linear,
    Llama-3.1 or LongRoPE scaling applied."""
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    if scaling is None:
        return inv_freq
    kind = scaling["rope_type"]
    if kind == "longrope":  # the short factors' frequencies (see RotaryEmbedding)
        return inv_freq / torch.tensor(scaling["short_factor"], dtype=torch.float32)
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    old_len = float(scaling["original_max_position_embeddings"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    wavelen = 2 * math.pi / inv_freq
    smooth = ((old_len / wavelen - low) / (high - low)).clamp(0, 1)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


class RotaryEmbedding(nn.Module):
    """A cos/sin table computed once for every position the engine can reach. `forward`
    looks up the angles of a batch's positions once per step; `apply_rotary` then rotates
    each layer's queries and keys with them."""

    cos_sin: torch.Tensor  # [rows, rotary_dim]: cos of each angle, then sin

    def __init__(
        self, rotary_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None
    ):
        super().__init__()
        all_inv_freq = [rope_inv_freq(rotary_dim, theta, scaling, max_positions)]
        if scaling is not None and scaling["rope_type"] == "longrope":
            # LongRoPE's long factors take rows max_positions.. (InputBuilder.positions)
            plain = rope_inv_freq(rotary_dim, theta, None, max_positions)
            all_inv_freq.append(plain / torch.tensor(scaling["long_factor"], dtype=torch.float32))
        steps = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.cat([torch.outer(steps, f) for f in all_inv_freq])
        gain = float(scaling.get("attention_factor", 1.0)) if scaling else 1.0
        table = torch.cat([freqs.cos(), freqs.sin()], dim=-1) * gain
        self.register_buffer("cos_sin", table, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        """(cos, sin), each [num_tokens, 1, rotary_dim / 2], broadcasting over heads.
        `positions` are rows of the table: the tokens' positions, shifted by max_positions
        where LongRoPE's long factors rotate."""
        cos, sin = self.cos_sin[positions].to(dtype).unsqueeze(1).chunk(2, dim=-1)
        return cos, sin


def apply_rotary(x: torch.Tensor, rope: Rope, head_dim: int) -> torch.Tensor:
    """Rotate the two halves of the leading rotary dims of each head of x
    [num_tokens, heads * head_dim]; the rest of each head passes through (a new tensor)."""
    cos, sin = rope
    half = cos.shape[-1]
    heads = x.view(x.shape[0], -1, head_dim)
    x1, x2 = heads[..., :half], heads[..., half : 2 * half]
    parts = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
    if 2 * half < head_dim:
        parts.append(heads[..., 2 * half :])
    return torch.cat(parts, dim=-1).view(x.shape)


def uses_long_factors(seq_len: int, longrope_original: int | None) -> bool:
    """LongRoPE's rule, as transformers applies it to a whole sequence: the long factors
    rotate every token of a sequence longer than the original context."""
    return longrope_original is not None and seq_len > longrope_original
