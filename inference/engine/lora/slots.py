"""LoRA in the forward pass: the device slots that hold adapters' weights, and the per-step
batch that says which token uses which slot.

Every target linear of every layer gets `max_loras` stacked A [S, R, in] and B [S, out, R]
per output slice (q/k/v of `qkv_proj`, gate/up of `gate_up_proj`), padded to
`max_lora_rank`. They are views into one [max_loras, slot_numel] tensor, slot-major, so an
adapter is one contiguous row: a swap-in is a single host-to-device copy, and an adapter
that does not target a module simply has zeros there (its delta is exactly zero).
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from inference.kernels import add_lora, make_lora_batch, select_backend
from inference.kernels.lora_batch import LoRABatch
from inference.kernels.lora_checks import check_add_lora

from ..model.context import get_forward_context
from ..model.decoder import PACKED_MODULES, CausalLM
from ..model.layers import Linear
from ..request import LoRARequest
from .peft_rules import TARGET_MODULES, AdapterSpec

# An adapter's factors: (layer, module) -> (A [r, in], B [out, r])
Factors = dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
# Where a swap-in's time is: seconds (CPU), or CUDA (start, end) events to read later
SwapTiming = float | tuple[torch.cuda.Event, torch.cuda.Event]


@dataclass
class HostAdapter:
    """An adapter in host memory, already laid out as one slot row (pinned on CUDA)."""

    request: LoRARequest
    spec: AdapterSpec
    weights: torch.Tensor  # [slot_numel], the slot's exact contents
    path: str

    @property
    def nbytes(self) -> int:
        return self.weights.numel() * self.weights.element_size()


class LinearLoRA:
    """One target linear's stacks: out += scale[slot] * (x A[slot]^T) B[slot]^T per token.

    The stacks' shapes, dtypes and device were checked once at start-up (`LoRASlots`), and
    the per-step batch only ever names slots the manager filled, so `apply` skips the
    kernels' input checks instead of repeating them 120 times per step."""

    def __init__(
        self, lora_a: list[torch.Tensor], lora_b: list[torch.Tensor], scales: torch.Tensor
    ):
        self.lora_a, self.lora_b, self.scales = lora_a, lora_b, scales

    def apply(self, out: torch.Tensor, x: torch.Tensor) -> None:
        step = get_forward_context().lora
        if step is None:  # no adapter in this batch: no LoRA work at all
            return
        add_lora(
            out, x, self.lora_a, self.lora_b, self.scales, step.batch, step.buffer, check=False
        )


@dataclass
class LoRAStep:
    """What the LoRA layers read from the ForwardContext in one step."""

    batch: LoRABatch
    buffer: torch.Tensor  # fp32 scratch [max slices, >= num_tokens, max_lora_rank]


class LoRASlots:
    """The device side: `max_loras` slots for every target linear, allocated once."""

    def __init__(self, model: CausalLM, max_loras: int, max_rank: int, max_tokens: int):
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.num_slots, self.max_rank = max_loras, max_rank
        # (layer, module) -> (A offset, B offset, in_features, out_features) in a slot row
        self.offsets: dict[tuple[int, str], tuple[int, int, int, int]] = {}
        targets = list(_target_linears(model))
        numel = 0
        for layer, _, linear, modules in targets:
            for module, width in zip(modules, linear.output_sizes, strict=True):
                a_off, b_off = numel, numel + max_rank * linear.in_features
                self.offsets[(layer, module)] = (a_off, b_off, linear.in_features, width)
                numel = b_off + width * max_rank
        self.slot_numel = numel
        self.weights = torch.zeros(max_loras, numel, dtype=self.dtype, device=self.device)
        self.scales = torch.zeros(max_loras, dtype=torch.float32, device=self.device)
        max_slices = max(len(modules) for *_, modules in targets)
        self.buffer = torch.empty(
            max_slices, max_tokens, max_rank, dtype=torch.float32, device=self.device
        )
        self.backend = select_backend(self.device)
        check = make_lora_batch(torch.tensor([0]), device=self.device, backend=self.backend)
        for layer, _, linear, modules in targets:
            lora_a, lora_b = [], []
            for module in modules:
                a_off, b_off, fan_in, fan_out = self.offsets[(layer, module)]
                lora_a.append(self.weights[:, a_off:b_off].unflatten(1, (max_rank, fan_in)))
                lora_b.append(
                    self.weights[:, b_off : b_off + fan_out * max_rank].unflatten(
                        1, (fan_out, max_rank)
                    )
                )
            linear.lora = LinearLoRA(lora_a, lora_b, self.scales)
            x = torch.zeros(1, linear.in_features, dtype=self.dtype, device=self.device)
            out = torch.zeros(1, linear.out_features, dtype=self.dtype, device=self.device)
            check_add_lora(out, x, lora_a, lora_b, self.scales, check)  # once, not per step

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.weights, self.scales, self.buffer))

    def pack(self, spec: AdapterSpec, tensors: Factors, pin: bool) -> torch.Tensor:
        """An adapter's factors {(layer, module): (A [r, in], B [out, r])} as one slot row:
        zero-padded to max_lora_rank, zeros for modules it does not adapt, serving dtype."""
        row = torch.zeros(self.slot_numel, dtype=self.dtype, pin_memory=pin)
        r, rank = spec.rank, self.max_rank
        for key, (a, b) in tensors.items():
            a_off, b_off, fan_in, fan_out = self.offsets[key]
            row[a_off : a_off + rank * fan_in].view(rank, fan_in)[:r].copy_(a)
            row[b_off : b_off + fan_out * rank].view(fan_out, rank)[:, :r].copy_(b)
        return row

    def write(self, slot: int, adapter: HostAdapter) -> None:
        """Copy an adapter into a slot; on CUDA the copy is queued on the current stream (the
        forward that reads it comes later on the same stream), so the host need not wait."""
        self.weights[slot].copy_(adapter.weights, non_blocking=True)
        self.scales[slot] = adapter.spec.scale

    def clear(self, slot: int) -> None:
        self.scales[slot] = 0.0  # a stale slot contributes nothing even if named by mistake

    def make_step(self, token_slots: list[int]) -> LoRAStep | None:
        """The batch's LoRA metadata; None when no token uses an adapter (base-only batch)."""
        if all(s < 0 for s in token_slots):
            return None
        assert max(token_slots) < self.num_slots, "token slot beyond max_loras"
        slots = torch.tensor(token_slots, dtype=torch.int64)
        batch = make_lora_batch(slots, device=self.device, backend=self.backend)
        buffer = self.buffer
        if batch.num_tokens > buffer.shape[1]:  # a warm-up larger than any step
            buffer = buffer.new_empty(buffer.shape[0], batch.num_tokens, buffer.shape[2])
        return LoRAStep(batch, buffer)


def _target_linears(model: CausalLM) -> Iterator[tuple[int, str, Linear, list[str]]]:
    """(layer index, name, Linear, adapter module names of its output slices) for every
    linear a LoRA may target, in model order."""
    merged: dict[str, list[str]] = {}
    for module, (name, _) in sorted(PACKED_MODULES.items(), key=lambda kv: kv[1]):
        merged.setdefault(name, []).append(module)
    for layer, block in enumerate(model.model.layers):
        for name, linear in block.named_modules():
            short = name.rsplit(".", 1)[-1]
            if not isinstance(linear, Linear):
                continue
            modules = merged.get(short, [short] if short in TARGET_MODULES else None)
            if modules is not None:
                yield layer, name, linear, modules


def timed_write(slots: LoRASlots, slot: int, adapter: HostAdapter) -> SwapTiming:
    """Write and return (start event, end event) on CUDA or the seconds it took on CPU."""
    if slots.device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        slots.write(slot, adapter)
        end.record()
        return start, end
    t0 = time.perf_counter()
    slots.write(slot, adapter)
    return time.perf_counter() - t0
