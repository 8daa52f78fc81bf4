"""The model's shape and its family's switches, as read from its config.json."""

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ModelLoadError
from .families import FAMILIES, FULL, SLIDING, family_traits
from .fingerprint import ArchFingerprint, FingerprintError, fingerprint_from_config
from .quantization import QuantizationScheme

SUPPORTED_ARCHITECTURES = tuple(FAMILIES)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")

Rope = tuple[float, dict[str, Any] | None]  # (theta, scaling or None)


@dataclass(frozen=True)
class ModelConfig:
    """The numbers of a config.json the engine needs, and its family's switches
    (families.py)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None
    fingerprint: ArchFingerprint  # the shapes adapters are checked against (the whole model's)
    family: str = "llama"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each head of q and k, before rotary
    norm_offset: float = 0.0  # Gemma's norms scale by (1 + w)
    sandwich_norms: bool = False  # Gemma: norms after attention and around the MLP too
    hidden_act: str = "silu"
    embed_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    query_pre_attn_scalar: float | None = None  # attention scale is its -1/2 power
    layer_windows: tuple[int | None, ...] = ()  # per layer: its sliding window, None = global
    local_rope: Rope | None = None  # sliding layers' rotary, where it differs (Gemma 3)
    rotary_dim: int = 0  # leading dims of each head that rotate (Phi's partial rotary)

    @property
    def quantization(self) -> QuantizationScheme | None:
        """The checkpoint's quantization (config.json's quantization_config); None when its
        weights are in a float dtype."""
        return self.fingerprint.quantization

    @property
    def attn_scale(self) -> float:
        scalar = float(self.query_pre_attn_scalar or self.head_dim)
        return 1.0 / math.sqrt(scalar)

    @property
    def attention_cost_context(self) -> int:
        """The position at which a token's attention (scores and weighted values over the
        tokens before it) takes as many multiply-adds as its linear layers, a gated MLP's
        three matrices among them."""
        q_width = self.num_heads * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        linear = self.hidden_size * (2 * q_width + 2 * kv_width + 3 * self.intermediate_size)
        return max(1, linear // (2 * q_width))

    @property
    def uniform_window(self) -> int | None:
        """The sliding window, when every layer has one (then old blocks can be let go)."""
        windows = set(self.layer_windows)
        if len(windows) == 1 and None not in windows:
            return windows.pop()
        return None

    @property
    def longrope_original(self) -> int | None:
        """LongRoPE's original context, past which the long factors rotate."""
        if self.rope_scaling is None or self.rope_scaling["rope_type"] != "longrope":
            return None
        return int(self.rope_scaling["original_max_position_embeddings"])

    def layer_rope(self, layer: int) -> Rope:
        if self.local_rope is not None and self.layer_windows[layer] is not None:
            return self.local_rope
        return self.rope_theta, self.rope_scaling

    @classmethod
    def from_folder(cls, folder: str | Path) -> "ModelConfig":
        path = Path(folder) / "config.json"
        if not Path(folder).is_dir():
            raise ModelLoadError(f"model folder {folder} does not exist or is not a folder")
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ModelLoadError(
                f"{path} is missing; point the engine at a Hugging Face model folder"
            ) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelLoadError(f"{path} is not valid JSON ({e}); re-download the model") from None
        if not isinstance(raw, dict):
            raise ModelLoadError(f"{path} must hold a JSON object")
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> "ModelConfig":
        archs = raw.get("architectures") or []
        if not isinstance(archs, list):
            raise ModelLoadError(f"{source}: architectures must be a list, got {archs!r:.80}")
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ModelLoadError(
                f"{source}: architecture {archs or 'unknown'} is not supported; "
                f"the engine serves {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        try:  # the dimensions are read as the registry's and the loader's checks read them
            dims = fingerprint_from_config(raw | {"architectures": [arch]}, source)
        except FingerprintError as e:
            raise ModelLoadError(str(e)) from None
        (theta, scaling), local_rope, rotary_dim = _ropes(raw, dims.head_dim, source)
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos if isinstance(eos, list) else [] if eos is None else [eos])
        return cls(
            architecture=arch,
            vocab_size=dims.vocab,
            hidden_size=dims.hidden,
            intermediate_size=dims.intermediate,
            num_layers=dims.num_layers,
            num_heads=dims.heads,
            num_kv_heads=dims.kv_heads,
            head_dim=dims.head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            eos_token_ids=tuple(int(i) for i in eos_ids),
            sliding_window=raw.get("sliding_window"),
            fingerprint=dims,
            local_rope=local_rope,
            rotary_dim=rotary_dim,
            **family_traits(raw, FAMILIES[arch], dims.num_layers, source),
        )


def _ropes(raw: dict[str, Any], head_dim: int, source: str) -> tuple[Rope, Rope | None, int]:
    """(global rope, sliding layers' rope if different, rotary dims) from either layout:
    transformers 5 writes `rope_parameters` (per layer type for Gemma 3), older configs a
    top-level `rope_theta` plus `rope_scaling` (and Gemma 3's `rope_local_base_freq`)."""
    params = dict(raw.get("rope_parameters") or {})
    local: Rope | None = None
    if isinstance(params.get(FULL), dict):  # one set per layer type
        local_params = params.get(SLIDING) or {}
        params = dict(params[FULL])
        local = _rope(raw, {}, dict(local_params), source)
    elif raw.get("rope_local_base_freq") is not None:
        local = float(raw["rope_local_base_freq"]), None
    partial = float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
    rotary_dim = int(head_dim * partial)
    if not 0 < rotary_dim <= head_dim or rotary_dim % 2:
        raise ModelLoadError(
            f"{source}: partial_rotary_factor {partial} leaves {rotary_dim} of {head_dim} "
            "head dims to rotate; it must be an even, positive number"
        )
    rope = _rope(raw, dict(raw.get("rope_scaling") or {}), params, source)
    if rope[1] is not None and rope[1]["rope_type"] == "longrope":
        _check_longrope(rope[1], rotary_dim, raw, source)
    return rope, local, rotary_dim


def _rope(
    raw: dict[str, Any], scaling: dict[str, Any], params: dict[str, Any], source: str
) -> Rope:
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    merged = {**scaling, **params}
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type == "su":  # early Phi-3 configs' name for LongRoPE
        rope_type = "longrope"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"{source}: rope type {rope_type!r} is not supported "
            f"({', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    if rope_type == "default":
        return float(theta), None
    merged["rope_type"] = rope_type
    merged.pop("type", None)
    merged.pop("rope_theta", None)
    merged.pop("partial_rotary_factor", None)
    if rope_type == "longrope":
        return float(theta), merged
    if "factor" not in merged:
        raise ModelLoadError(f"{source}: rope scaling {rope_type!r} needs a 'factor'")
    if rope_type == "llama3":
        merged.setdefault("original_max_position_embeddings", raw.get("max_position_embeddings"))
        for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if merged.get(key) is None:
                raise ModelLoadError(f"{source}: llama3 rope scaling needs {key!r}")
    return float(theta), merged


def _check_longrope(
    scaling: dict[str, Any], rotary_dim: int, raw: dict[str, Any], source: str
) -> None:
    """Fill in LongRoPE's derived numbers the way transformers does, after checking it."""
    original = scaling.get("original_max_position_embeddings") or raw.get(
        "original_max_position_embeddings"
    )
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise ModelLoadError(f"{source}: longrope needs original_max_position_embeddings")
    for key in ("short_factor", "long_factor"):
        factors = scaling.get(key)
        if (
            not isinstance(factors, list)
            or len(factors) != rotary_dim // 2
            or not all(isinstance(f, int | float) and f > 0 for f in factors)
        ):
            raise ModelLoadError(
                f"{source}: longrope {key} must list {rotary_dim // 2} positive numbers"
            )
    factor = scaling.get("factor") or raw.get("max_position_embeddings", original) / original
    if scaling.get("attention_factor") is None:
        scaling["attention_factor"] = (
            1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        )
    scaling["original_max_position_embeddings"] = original
