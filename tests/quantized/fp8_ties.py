"""FP8 activation rounding ties, and a float64 twin that tells them apart from a wrong engine.

FP8 schemes quantize every projection's input: u = x / s (s the token's amax / 448, or the
stored input_scale), rounded to the nearest e4m3 value. Rounding is a step function. Where
an activation's exact u lies nearer a midpoint between two e4m3 values than the fp32 error
of x (about 1e-7 of the token's amax in either implementation, its last bits set by the
kernels torch picks for the CPU: at AVX-512 and at AVX2 ATen rounds the same attention
apart in the last bit), fp32 arithmetic does not decide the code, and the two codes
differ by a whole e4m3 step (0.25 at u = 3.875): the logits move by 1e-2, far past the
parity tests' 1e-4. Which side an implementation lands on is then chance, not correctness.

The twin holds the checkpoint's weights dequantized exactly (wq * ws in float64), the
adapter in float64, and quantizes the activations itself, so it knows each exact u. A
parity step whose fp32 logits differ is accepted only where the twin reproduces the
engine's row within the tolerance: as computed, or with one near-tie activation (within
NOISE of a midpoint) rounded the other way. Any other difference still fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from peft import PeftModel
from safetensors.torch import load_file
from torch import nn
from transformers import AutoModelForCausalLM

from tests.quantized.compressed_format import WEIGHTS, quantization_config

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# The band around a midpoint counted as a tie, as a fraction of the token's largest |x|:
# several times the fp32 error of either side measured against float64 (1e-7 to 3e-7).
NOISE = 1e-6
_CODES = torch.arange(256, dtype=torch.uint8).view(FP8).double()
E4M3_VALUES = torch.unique(_CODES[_CODES.isfinite()])  # sorted, -448 .. 448


@dataclass(frozen=True)
class Tie:
    """One activation whose exact x / scale sits within NOISE of an e4m3 midpoint."""

    site: int  # which quantized input, in forward order (q, k and v share one)
    module: str
    token: int
    column: int
    exact: float  # x / scale in float64
    below: float  # the e4m3 values either side
    above: float

    def __str__(self) -> str:
        return (
            f"{self.module} input, token {self.token}, column {self.column}: x/scale "
            f"{self.exact:.7f} in float64, {abs(self.exact - (self.below + self.above) / 2):.1e} "
            f"from the midpoint of e4m3 {self.below:g} and {self.above:g}"
        )


class Fp8Twin:
    """A float64 model of an FP8 compressed-tensors folder (and a PEFT adapter on it)."""

    def __init__(self, folder: Path, base: Path, adapter: Path | None = None):
        (group,) = quantization_config(folder)["config_groups"].values()
        self.dynamic = bool(group["input_activations"]["dynamic"])
        stored = load_file(str(folder / WEIGHTS))
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float64).eval()
        own = model.state_dict()
        state = {
            k: v.double()
            for k, v in stored.items()
            if k in own and v.dtype.is_floating_point and v.dtype != FP8
        }
        quantized = [k.removesuffix(".weight") for k, v in stored.items() if v.dtype == FP8]
        for name in quantized:
            state[f"{name}.weight"] = (
                stored[f"{name}.weight"].double() * stored[f"{name}.weight_scale"].double()
            )
        model.load_state_dict(state, strict=True)
        self.input_scales = {n: stored[f"{n}.input_scale"].double() for n in quantized
                             if f"{n}.input_scale" in stored}  # fmt: skip
        self._flip: Tie | None = None
        self._found: list[Tie] | None = None
        self._seen: list[tuple[torch.Tensor, float | None, torch.Tensor]] = []
        modules = dict(model.named_modules())
        for name in quantized:
            # on the Linear itself: PEFT keeps it as base_layer, and its A and B see the
            # input unquantized, as they do on compressed-tensors' model
            modules[name].register_forward_pre_hook(self._quantizing_hook(name))
        if adapter is not None:
            model = PeftModel.from_pretrained(model, str(adapter)).eval().double()
        self.model = model

    def _quantizing_hook(self, name: str):
        def hook(module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
            return (self._quantize(name, args[0]),)

        return hook

    def _quantize(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """x fake-quantized per the scheme; one site per distinct input (and scale), so q, k
        and v round their shared input alike, as the engine's merged projection does."""
        static = self.input_scales.get(name)
        key = None if static is None else float(static)
        for seen, scale_key, out in self._seen:
            if seen is x and scale_key == key:  # `seen` held: its id cannot be reused
                return out
        site = len(self._seen)
        amax = x.abs().amax(dim=-1, keepdim=True)
        if static is None:
            scale = torch.where(amax == 0, torch.finfo(torch.float32).eps, amax / FP8_MAX)
        else:
            scale = static.reshape(1, 1, 1).expand_as(amax)
        u = (x / scale).clamp(-FP8_MAX, FP8_MAX)
        q = u.to(FP8).double()
        i = torch.searchsorted(E4M3_VALUES, u.contiguous()).clamp(1, len(E4M3_VALUES) - 1)
        below, above = E4M3_VALUES[i - 1], E4M3_VALUES[i]
        if self._found is not None:
            band = NOISE * amax / scale
            near = ((u - (below + above) / 2).abs() <= band) & (u != above) & (u != below)
            for b, token, column in near.nonzero().tolist():
                at = (b, token, column)
                exact, low, high = float(u[at]), float(below[at]), float(above[at])
                self._found.append(Tie(site, name, token, column, exact, low, high))
        flip = self._flip
        if flip is not None and flip.site == site:
            at = (0, flip.token, flip.column)
            q[at] = flip.below if float(q[at]) == flip.above else flip.above
        out = q * scale
        self._seen.append((x, key, out))
        return out

    def _forward(self, ids: list[int]) -> torch.Tensor:
        self._seen = []
        try:
            with torch.no_grad():
                return self.model(torch.tensor([ids])).logits[0, -1]
        finally:
            self._seen = []

    def logits(self, ids: list[int], flip: Tie | None = None) -> torch.Tensor:
        """The last position's logits in float64; `flip`: that activation rounded the other way."""
        self._flip = flip
        try:
            return self._forward(ids)
        finally:
            self._flip = None

    def ties(self, ids: list[int]) -> list[Tie]:
        """The activations of a forward pass over `ids` that fp32 cannot round reliably."""
        self._found = []
        try:
            self._forward(ids)
            return self._found
        finally:
            self._found = None

    def explain(self, ids: list[int], row: torch.Tensor, atol: float) -> str | None:
        """How the engine's `row` for `ids` follows from the scheme, if it does: the twin's
        exact logits, or those with one tie rounded the other way; None when neither."""

        def gap(logits: torch.Tensor) -> float:
            return float((row.double() - logits).abs().max())

        exact = gap(self.logits(ids))
        if exact <= atol:
            return f"within {exact:.1e} of the float64 twin"
        for tie in self.ties(ids):
            flipped = gap(self.logits(ids, tie))
            if flipped <= atol:
                return (
                    f"an FP8 rounding tie: {tie}; rounded the other way, the float64 twin is "
                    f"within {flipped:.1e} of the engine (as computed, {exact:.1e})"
                )
        return None
