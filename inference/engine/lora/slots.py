"""LoRA in device memory: the slots that hold adapters' weights, and the per-step batch that
says which token uses which slot.

Every target linear of every layer gets S stacked A [S, R, in] and B [S, out, R] per output
slice (q/k/v of `qkv_proj`, gate/up of `gate_up_proj`), padded to `max_lora_rank`. They
are views into one [S, slot_numel] tensor, slot-major, so an adapter is one contiguous row:
a swap-in is a single host-to-device copy, and an adapter that does not target a module
simply has zeros there (its delta is exactly zero). That tensor is a strided view into the
KV cache's pool (memory_pool.py), bound once the pool exists (`bind`); until then, for the
start-up warm-up, a one-slot placeholder. The kernels take the slot stride from their
pointer tables, so where the rows lie changes no compiled variant. A module
whose scale differs from the adapter's (rank_pattern / alpha_pattern) has the ratio folded
into its B, so one scale per slot serves every module.

What only some adapters carry (DoRA scales, LoRA on embed_tokens / lm_head, whole saved
heads) lives in an arena of its own (arena.py), reserved at start-up and shared by the slots.
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from inference.kernels import make_lora_batch, select_backend
from inference.kernels.lora_checks import check_add_lora
from inference.kernels.lora_ops import check_tiles

from ..errors import ConfigError
from ..model.context import LoRAStep, SlotRows
from ..model.decoder import PACKED_MODULES, CausalLM
from ..model.layers import Linear
from ..request import LoRARequest
from .apply import EmbeddingLoRA, HeadAdapter, HeadLoRA, LinearLoRA, slot_rows
from .arena import ExtrasArena
from .extras import (
    DORA,
    DORA_BIAS,
    LORA_A,
    LORA_B,
    SAVED,
    BaseLinear,
    BaseView,
    HostExtras,
    build_extras,
    extras_views,
)
from .peft_rules import HEAD_LAYER, TARGET_MODULES, AdapterError, AdapterSpec, AdapterTensors
from .sharding import FactorSharder, refuse_extras_when_sharded, sharders

# An adapter's factors: (layer, module) -> (A [r, in], B [out, r])
Factors = dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
# Device memory for extras (see arena.py); unset: `default_extra_bytes`
EXTRA_BYTES_ENV = "LORAPLEX_LORA_EXTRA_BYTES"
SAVED_HEADS_DEFAULT_BYTES = 128 << 20
SCALE_DTYPE = BUFFER_DTYPE = torch.float32  # one scale per slot; the shrink's output
# The adapters with extras the default arena holds when max_loras is unset (the arena is
# reserved before the pool decides the slot count; the old default slot count)
DEFAULT_EXTRAS_SLOTS = 4
# Where a swap-in's time is: seconds (CPU), or CUDA (start, end) events to read later
SwapTiming = float | tuple[torch.cuda.Event, torch.cuda.Event]


@dataclass
class HostAdapter:
    """An adapter in host memory, already laid out as one slot row (pinned on CUDA), and its
    extras when it has any."""

    request: LoRARequest
    spec: AdapterSpec
    weights: torch.Tensor  # [slot_numel], the slot's exact contents
    path: str
    extras: HostExtras | None = None

    @property
    def extras_numel(self) -> int:
        return self.extras.numel if self.extras is not None else 0

    @property
    def nbytes(self) -> int:
        extra = self.extras.nbytes if self.extras is not None else 0
        return self.weights.numel() * self.weights.element_size() + extra


class LoRASlots:
    """The device side: slots for every target linear, and an arena of `extra_bytes` for
    the adapters' extras (default: `default_extra_bytes`, room for `max_loras` adapters'
    extras, or DEFAULT_EXTRAS_SLOTS' when the pool decides the slot count)."""

    def __init__(
        self,
        model: CausalLM,
        max_loras: int | None,
        max_rank: int,
        max_tokens: int,
        *,
        extra_bytes: int | None = None,
        max_saved_params: int,
        deterministic: bool = False,
    ):
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.max_rank = max_rank
        self.max_saved_params = max_saved_params
        self.targets = list(_target_linears(model))
        layout = slot_layout(model, max_rank)
        # (layer, module) -> (A offset, B offset, in_features, out_features) in a slot row
        self.offsets = layout.offsets
        self.slot_numel = numel = layout.numel
        self.buffer = torch.empty(
            layout.max_slices, max_tokens, max_rank, dtype=BUFFER_DTYPE, device=self.device
        )
        self.backend = select_backend(self.device)
        self.deterministic = deterministic  # every step's batch (see LoRABatch.deterministic)
        self.base = _base_view(model, self.targets)
        # tensor parallelism: each target's factors cut to this rank's shard (empty: whole)
        self.sharders: dict[tuple[int, str], FactorSharder] = sharders(self.targets)
        # rank 0 of a tensor-parallel engine: the slot writes (adapter) and clears (None)
        # since the last step, for the other ranks to repeat (see parallel_workers.py)
        self.journal: list[tuple[int, HostAdapter | None]] | None = None
        self.linear_lora: dict[tuple[int, str], LinearLoRA] = {}
        self._max_tokens = max_tokens
        self.bind(torch.zeros(1, numel, dtype=self.dtype, device=self.device))
        model.model.embed_tokens.lora = self.embed_lora = EmbeddingLoRA()
        model.lm_head.lora = self.head_lora = HeadLoRA()
        if extra_bytes is None:
            slots = max_loras if max_loras is not None else DEFAULT_EXTRAS_SLOTS
            extra_bytes = default_extra_bytes(model, slots, max_rank, max_saved_params, numel)
        self.arena = ExtrasArena(extra_bytes // self.dtype.itemsize, self.dtype, self.device)
        self.extras_at: dict[int, int] = {}  # slot -> start of its adapter's extras in the arena
        self.head_slots: set[int] = set()  # slots whose adapters change lm_head

    def bind(self, weights: torch.Tensor) -> None:
        """Serve the slots from `weights` [num_slots, slot_numel] (rows contiguous, any row
        stride): every target's stacks become views of it. Before any adapter is written."""
        assert weights.shape[1] == self.slot_numel and weights.stride(1) == 1
        assert weights.dtype == self.dtype, "the slots and the KV pool share the compute dtype"
        self.weights = weights
        self.num_slots = weights.shape[0]
        self.scales = torch.zeros(self.num_slots, dtype=SCALE_DTYPE, device=self.device)
        max_rank = self.max_rank
        check = make_lora_batch(torch.tensor([0]), device=self.device, backend=self.backend)
        for layer, name, linear, modules in self.targets:
            lora_a, lora_b = [], []
            for module in modules:
                a_off, b_off, fan_in, fan_out = self.offsets[(layer, module)]
                lora_a.append(weights[:, a_off:b_off].unflatten(1, (max_rank, fan_in)))
                lora_b.append(
                    weights[:, b_off : b_off + fan_out * max_rank].unflatten(1, (fan_out, max_rank))
                )
            linear.lora = self.linear_lora[(layer, name)] = LinearLoRA(lora_a, lora_b, self.scales)
            x = torch.zeros(1, linear.in_features, dtype=self.dtype, device=self.device)
            out = torch.zeros(1, linear.out_features, dtype=self.dtype, device=self.device)
            check_add_lora(out, x, lora_a, lora_b, self.scales, check)  # once, not per step
        stacks = [(s.lora_a, s.lora_b) for s in self.linear_lora.values()]
        try:  # a tile the device cannot launch fails the start, never a request
            check_tiles(stacks, self._max_tokens, self.backend)
        except ValueError as error:
            raise ConfigError(str(error)) from None

    @property
    def row_nbytes(self) -> int:
        return self.slot_numel * self.weights.element_size()

    @property
    def reserved_nbytes(self) -> int:
        """Device bytes LoRA keeps outside the pool: the shrink's scratch and the extras
        arena (the slots' scales, 4 bytes each, are not counted)."""
        return self.buffer.numel() * self.buffer.element_size() + self.arena.nbytes

    def pack(
        self, spec: AdapterSpec, tensors: AdapterTensors, pin: bool
    ) -> tuple[torch.Tensor, HostExtras | None]:
        """An adapter as it will sit in a slot: its layer factors {(layer, module): (A, B)}
        as one row (zero-padded to max_lora_rank, zeros for modules it does not adapt,
        serving dtype), and its extras. Runs on a loader thread; reads the base weights."""
        if self.sharders:
            refuse_extras_when_sharded(tensors)
        row = torch.zeros(self.slot_numel, dtype=self.dtype, pin_memory=pin)
        rank = self.max_rank
        for key, (a, b) in tensors.factors.items():
            if self.sharders:
                a, b = self.sharders[key](a, b)
            a_off, b_off, fan_in, fan_out = self.offsets[key]
            r = a.shape[0]
            ratio = tensors.scales[key] / spec.scale  # 1 unless a pattern set this module's
            row[a_off : a_off + rank * fan_in].view(rank, fan_in)[:r].copy_(a)
            b_rows = row[b_off : b_off + fan_out * rank].view(fan_out, rank)[:, :r]
            b_rows.copy_(b if ratio == 1 else b.float() * ratio)
        extras = build_extras(tensors, self.base, self.dtype, pin, self.max_saved_params)
        if extras is not None and extras.numel > self.arena.capacity:
            need, have = extras.nbytes, self.arena.nbytes
            raise AdapterError(
                f"its DoRA scales, embedding / lm_head factors and saved heads need {need:,} "
                f"bytes of device memory, more than the {have:,} this engine reserves for them "
                f"({EXTRA_BYTES_ENV})"
            )
        return row, extras

    def fits_extras(self, adapter: HostAdapter) -> bool:
        return adapter.extras is None or self.arena.fits(adapter.extras.numel)

    def holds_extras(self, slot: int) -> bool:
        return slot in self.extras_at

    def extras_numel(self, slot: int) -> int:
        start = self.extras_at.get(slot)
        return 0 if start is None else self.arena.numel_at(start)

    def write(self, slot: int, adapter: HostAdapter) -> None:
        """Copy an adapter into a slot; on CUDA the copies are queued on the current stream (the
        forward that reads them comes later on the same stream), so the host need not wait.
        Room for its extras must have been checked (`fits_extras`)."""
        if self.journal is not None:
            self.journal.append((slot, adapter))
        self.weights[slot].copy_(adapter.weights, non_blocking=True)
        self.scales[slot] = adapter.spec.scale
        if adapter.extras is not None:
            start = self.arena.alloc(adapter.extras.numel)
            assert start is not None, "no arena room: the allocator checks fits_extras first"
            self.arena.data[start : start + adapter.extras.numel].copy_(
                adapter.extras.flat, non_blocking=True
            )
            self.extras_at[slot] = start
            self._attach(slot, adapter.extras, extras_views(self.arena.data, start, adapter.extras))

    def clear(self, slot: int) -> None:
        if self.journal is not None:
            self.journal.append((slot, None))
        self.scales[slot] = 0.0  # a stale slot contributes nothing even if named by mistake
        self.weights[slot].zero_()  # its pages go back to the KV side zeroed, as they started
        start = self.extras_at.pop(slot, None)
        if start is None:
            return
        for lora in self.linear_lora.values():
            lora.dora.pop(slot, None)
        self.embed_lora.adapters.pop(slot, None)
        self.head_lora.adapters.pop(slot, None)
        self.head_slots.discard(slot)
        self.arena.release(start)

    def _attach(
        self, slot: int, extras: HostExtras, views: dict[tuple[str, int, str], torch.Tensor]
    ) -> None:
        """Hand each layer the views of the pieces it applies."""
        for (kind, layer, name), view in views.items():
            if kind == DORA and layer != HEAD_LAYER:
                self.linear_lora[(layer, name)].dora[slot] = (
                    view,
                    views.get((DORA_BIAS, layer, name)),
                )
        for head, hook in (("embed_tokens", self.embed_lora), ("lm_head", self.head_lora)):
            pieces = {
                kind: views.get((kind, HEAD_LAYER, head)) for kind in (SAVED, LORA_A, LORA_B, DORA)
            }
            if not any(p is not None for p in pieces.values()):
                continue
            hook.adapters[slot] = HeadAdapter(
                saved=pieces[SAVED],
                lora_a=pieces[LORA_A],
                lora_b=pieces[LORA_B],
                scale=extras.head_scales.get(head, 0.0),
                dora=pieces[DORA],
            )
            if head == "lm_head":
                self.head_slots.add(slot)

    def make_step(self, token_slots: list[int]) -> LoRAStep | None:
        """The batch's LoRA metadata; None when no token uses an adapter (base-only batch)."""
        if all(s < 0 for s in token_slots):
            return None
        assert max(token_slots) < self.num_slots, "token slot beyond max_loras"
        slots = torch.tensor(token_slots, dtype=torch.int64)
        batch = make_lora_batch(
            slots, device=self.device, backend=self.backend, deterministic=self.deterministic
        )
        buffer = self.buffer
        if batch.num_tokens > buffer.shape[1]:  # a warm-up larger than any step
            buffer = buffer.new_empty(buffer.shape[0], batch.num_tokens, buffer.shape[2])
        extra_rows = (
            slot_rows(token_slots, set(self.extras_at), self.device) if self.extras_at else []
        )
        return LoRAStep(batch, buffer, extra_rows)

    def head_rows(self, row_slots: list[int]) -> SlotRows | None:
        """The lm_head rows of adapters that change lm_head (see ForwardContext.lora_head)."""
        if not self.head_slots:
            return None
        return slot_rows(row_slots, self.head_slots, self.device) or None


@dataclass(frozen=True)
class SlotLayout:
    """Where each target's factors sit in a slot row, padded to the largest rank."""

    offsets: dict[tuple[int, str], tuple[int, int, int, int]]  # (A, B, in, out) per module
    numel: int  # one slot row's elements
    max_slices: int  # the most output slices one target linear has (q, k, v: 3)


def slot_layout(model: CausalLM, max_rank: int) -> SlotLayout:
    """Every target linear of every layer, each output slice's A [max_rank, in] then B
    [out, max_rank], in model order; a rank's shapes under tensor parallelism."""
    offsets: dict[tuple[int, str], tuple[int, int, int, int]] = {}
    numel = max_slices = 0
    for layer, _, linear, modules in _target_linears(model):
        max_slices = max(max_slices, len(modules))
        for module, width in zip(modules, linear.output_sizes, strict=True):
            a_off, b_off = numel, numel + max_rank * linear.in_features
            offsets[(layer, module)] = (a_off, b_off, linear.in_features, width)
            numel = b_off + width * max_rank
    return SlotLayout(offsets, numel, max_slices)


def reserved_nbytes(
    model: CausalLM,
    max_loras: int | None,
    max_rank: int,
    max_tokens: int,
    *,
    extra_bytes: int | None,
    max_saved_params: int,
) -> int:
    """`LoRASlots.reserved_nbytes` with these settings, from the model's shapes alone: the
    shrink buffer and the extras arena, which stay outside the pool."""
    layout = slot_layout(model, max_rank)
    itemsize = model.lm_head.weight.element_size()
    if extra_bytes is None:
        slots = max_loras if max_loras is not None else DEFAULT_EXTRAS_SLOTS
        extra_bytes = default_extra_bytes(model, slots, max_rank, max_saved_params, layout.numel)
    buffer = layout.max_slices * max_tokens * max_rank * BUFFER_DTYPE.itemsize
    return buffer + extra_bytes // itemsize * itemsize


def default_extra_bytes(
    model: CausalLM, max_loras: int, max_rank: int, max_saved_params: int, row_numel: int
) -> int:
    """Room for `max_loras` adapters with DoRA on every target and LoRA at max_lora_rank on
    both heads, plus one adapter's two saved heads when a head is small enough to be saved
    and the two take no more than the slot rows do or SAVED_HEADS_DEFAULT_BYTES (SmolLM2's
    two heads in bf16 fit; a CPU engine's fp32 copies of them cost more than its slots and
    need LORAPLEX_LORA_EXTRA_BYTES)."""
    vocab, hidden = model.lm_head.weight.shape
    dora = hidden + vocab  # the heads' scales
    for linear in model.modules():
        if isinstance(linear, Linear) and linear is not model.lm_head:
            dora += linear.out_features * (2 if linear.bias is not None else 1)
    heads = 2 * (vocab + hidden) * max_rank
    itemsize = model.lm_head.weight.element_size()
    saved = 2 * vocab * hidden
    room = max(max_loras * row_numel, SAVED_HEADS_DEFAULT_BYTES // itemsize)
    if vocab * hidden > max_saved_params or saved > room:
        saved = 0
    return (max_loras * (dora + heads) + saved) * itemsize


def _base_view(model: CausalLM, targets: list[tuple[int, str, Linear, list[str]]]) -> BaseView:
    linears, linear_of = {}, {}
    for layer, name, linear, modules in targets:
        slices = {m: linear.output_slice(i) for i, m in enumerate(modules)}
        linears[(layer, name)] = BaseLinear(linear.weight, linear.bias, slices)
        for module in modules:
            linear_of[(layer, module)] = (layer, name)
    heads: dict[str, torch.Tensor] = {
        "embed_tokens": model.model.embed_tokens.weight,
        "lm_head": model.lm_head.weight,
    }
    return BaseView(linears, linear_of, heads)


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
