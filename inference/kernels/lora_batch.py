"""Per-step LoRA batch metadata: which tokens use which adapter slot.

Built once per engine step and shared by every layer. Tokens are grouped by slot with one
stable sort, so every active slot owns one contiguous *segment* of `sorted_token_ids`
(Punica's SGMV segments, made contiguous by sorting instead of by request order). The
segment table lives both on the device (for kernels) and on the host (for launch grids and
the CPU loop), so no layer ever has to synchronise with the device to read it.
"""

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch

from inference.kernels.backend import check_backend, select_backend

PATHS = ("sgmv", "bgmv")
# The padded layout (the torch backend's bmm over segments padded to the longest) is worth
# its wasted rows while they stay within twice the real ones, or this many rows in all.
PADDED_MIN_ROWS = 256
# Mean tokens per active slot from which the segment kernels (SGMV) beat the per-token ones
# (BGMV): below it, most rows of a tl.dot tile would be padding. Decode with one request per
# adapter has a mean of 1; prefill has hundreds.
SGMV_MIN_MEAN_SEGMENT = 4


def pads_within(padded_rows: int, real_rows: int) -> bool:
    """Whether a padded layout of `padded_rows` is worth it for `real_rows` tokens."""
    return padded_rows <= max(PADDED_MIN_ROWS, 2 * real_rows)


@dataclass(frozen=True)
class LoRABatch:
    token_slots: torch.Tensor  # [T] int64, device; -1 = no adapter
    sorted_token_ids: torch.Tensor  # [T_active] int64, device; tokens with an adapter, by slot
    seg_starts: torch.Tensor  # [G] int64, device; segment g is sorted_token_ids[start:start+len]
    seg_lens: torch.Tensor  # [G] int64, device
    seg_slots: torch.Tensor  # [G] int64, device; slot of segment g
    padded_rows: torch.Tensor  # [T_active] int64, device; g * max_seg_len + position in segment
    segments: tuple[tuple[int, int, int], ...]  # host copy: (slot, start, length) per segment
    num_tokens: int  # T, including tokens without an adapter
    max_seg_len: int  # longest segment; sizes the SGMV grid
    max_slot: int  # highest slot used, -1 if none; checked against the stacked weights
    path: str  # "sgmv" (segments) or "bgmv" (one program per token)
    backend: str  # "torch" or "triton"
    # Triton: no shrink splits its reduction over programs, whose fp32 atomics add in an
    # order that changes run to run (lora_triton.launch_tiles); the engine's
    # deterministic_kernels setting
    deterministic: bool = False

    @property
    def num_segments(self) -> int:
        return len(self.segments)

    @property
    def device(self) -> torch.device:
        return self.token_slots.device

    @property
    def min_slot(self) -> int:
        """The lowest slot used (segments go by slot), -1 if none."""
        return self.segments[0][0] if self.segments else -1

    @property
    def slot_span(self) -> int:
        """Slots from the lowest used to the highest, both included."""
        return self.max_slot - self.min_slot + 1 if self.segments else 0

    @functools.cached_property
    def slot_rows(self) -> torch.Tensor:
        """[T_active] row of each sorted token when every slot of the span (min_slot to
        max_slot), not only the active ones, is a padded group: (slot - min_slot) *
        max_seg_len + position in its segment. Computed once per batch (a step), though every
        layer of the model reads it."""
        m = self.max_seg_len
        slots = self.seg_slots.index_select(0, self.padded_rows // m) - self.min_slot
        return slots * m + self.padded_rows % m

    def pads_well(self) -> bool:
        """Whether padding every segment to the longest stays within PADDED_MIN_ROWS rows
        or twice the real ones (a single segment needs no padding at all)."""
        padded, real = self.num_segments * self.max_seg_len, self.padded_rows.numel()
        return self.num_segments > 1 and pads_within(padded, real)

    @functools.cached_property
    def padding_groups(self) -> tuple["LoRABatch", ...]:
        """The batch as sub-batches of segments of similar length, each padding well (or a
        single segment): with Zipf-like traffic one adapter has many tokens and many have
        one, and padding all to the longest wastes more than it saves, while a product per
        segment pays a dozen ops per adapter in every layer. Segments are taken shortest
        first; a group closes when the next one would pad it badly. Each sub-batch has the
        same tokens, the others' marked -1. Computed once per batch (a step)."""
        groups: list[list[int]] = [[]]
        rows = 0
        for i in sorted(range(self.num_segments), key=lambda i: self.segments[i][2]):
            length = self.segments[i][2]
            size = len(groups[-1]) + 1
            if size > 1 and not pads_within(size * length, rows + length):
                groups.append([])
                rows = 0
            groups[-1].append(i)
            rows += length
        if len(groups) == 1:
            return (self,)
        host, ids = self.token_slots.to("cpu"), self.sorted_token_ids.to("cpu")
        parts = []
        for group in groups:
            keep = torch.cat(
                [ids[start : start + n] for _, start, n in map(self.segments.__getitem__, group)]
            )
            masked = torch.full_like(host, -1)
            masked[keep] = host[keep]
            segments = _segments(masked)
            parts.append(
                _upload(masked, segments, self.device, self.path, self.backend, self.deterministic)
            )
        return tuple(parts)

    @functools.cached_property
    def token_padded_rows(self) -> torch.Tensor:
        """padded_rows in token order instead of sorted order; when every token has an
        adapter, the padded layout is then one gather or scatter away from the tokens."""
        return torch.empty_like(self.padded_rows).index_copy_(
            0, self.sorted_token_ids, self.padded_rows
        )

    @functools.cached_property
    def token_slot_rows(self) -> torch.Tensor:
        """slot_rows in token order (see token_padded_rows)."""
        return torch.empty_like(self.slot_rows).index_copy_(
            0, self.sorted_token_ids, self.slot_rows
        )


def make_lora_batch(
    token_slots: torch.Tensor,
    *,
    device: torch.device | str | None = None,
    path: str | None = None,
    backend: str | None = None,
    deterministic: bool = False,
) -> LoRABatch:
    """Group tokens by adapter slot. One host copy of the slots, one sort, one upload.

    `device` defaults to token_slots' device; an engine that builds the slots on the host
    passes its device here and skips a device-to-host copy. `path` and `backend` default to
    the heuristic and `select_backend`; benchmarks and tests force them. `deterministic`:
    see LoRABatch.
    """
    _check_token_slots(token_slots)
    device = token_slots.device if device is None else torch.device(device)
    backend = select_backend(device) if backend is None else backend
    check_backend(backend, device)
    if path is not None and path not in PATHS:
        raise ValueError(f"path={path!r} is not a LoRA kernel path; use one of {PATHS}")
    host = token_slots.detach().to("cpu", torch.int64)
    if host.numel() and int(host.min()) < -1:
        raise ValueError(
            f"token slot {int(host.min())} is invalid: slots are >= 0, or -1 for no adapter"
        )
    return _upload(host, _segments(host), device, path, backend, deterministic)


def _check_token_slots(token_slots: object) -> None:
    if not isinstance(token_slots, torch.Tensor):
        raise ValueError(f"token_slots must be a torch.Tensor, got {type(token_slots).__name__}")
    if token_slots.dim() != 1:
        raise ValueError(
            f"token_slots must be 1-D [num_tokens], got shape {tuple(token_slots.shape)}"
        )
    if (
        token_slots.dtype.is_floating_point
        or token_slots.dtype.is_complex
        or token_slots.dtype == torch.bool
    ):
        raise ValueError(f"token_slots must be an integer tensor, got {token_slots.dtype}")


class _Segments(NamedTuple):
    """The host-side grouping of one step's tokens, before the upload."""

    active_ids: torch.Tensor  # tokens with an adapter, by slot (a stable sort)
    starts: torch.Tensor
    lens: torch.Tensor
    slots: torch.Tensor
    padded_rows: torch.Tensor
    max_len: int


def _segments(host: torch.Tensor) -> _Segments:
    """One stable sort of the host slots; the -1 tokens (no adapter) sort first and drop out."""
    sorted_slots, order = torch.sort(host, stable=True)
    slots, lens = torch.unique_consecutive(sorted_slots, return_counts=True)
    num_inactive = int(lens[0]) if slots.numel() and int(slots[0]) == -1 else 0
    if num_inactive:
        slots, lens = slots[1:], lens[1:]
    starts = torch.cumsum(lens, 0) - lens
    active_ids = order[num_inactive:]
    max_len = int(lens.max()) if lens.numel() else 0
    segment_of = torch.repeat_interleave(torch.arange(lens.numel()), lens)
    padded_rows = segment_of * max_len + torch.arange(active_ids.numel()) - starts[segment_of]
    return _Segments(active_ids, starts, lens, slots, padded_rows, max_len)


def _upload(
    host: torch.Tensor,
    segs: _Segments,
    device: torch.device,
    path: str | None,
    backend: str,
    deterministic: bool,
) -> LoRABatch:
    """One upload for the whole table instead of one per field, to CUDA from pinned memory
    without waiting (from pageable memory the copy would wait for the device's queued
    work); the host keeps the segments for launch grids and the CPU loop."""
    parts = [host, segs.active_ids, segs.starts, segs.lens, segs.slots, segs.padded_rows]
    # every field starts 16-byte aligned (an even count of int64 before it), whatever the
    # step's sizes: Triton compiles a variant per pointer alignment, and start-up compiles
    # the aligned one only (inference/engine/kernel_warmup.py)
    packed = torch.cat([torch.cat([p, p.new_zeros(p.numel() % 2)]) for p in parts])
    n_tok, n_act, n_seg = host.numel(), segs.active_ids.numel(), segs.slots.numel()
    if device.type == "cuda":
        packed = packed.pin_memory()
    on_device = packed.to(device, non_blocking=device.type == "cuda")
    fields = on_device.split([p.numel() + p.numel() % 2 for p in parts])
    token_dev, ids_dev, starts_dev, lens_dev, slots_dev, padded_dev = (
        f[: p.numel()] for f, p in zip(fields, parts, strict=True)
    )
    segments = tuple(
        zip(segs.slots.tolist(), segs.starts.tolist(), segs.lens.tolist(), strict=True)
    )
    if path is None:
        path = "sgmv" if n_act >= SGMV_MIN_MEAN_SEGMENT * max(n_seg, 1) else "bgmv"
    return LoRABatch(
        token_slots=token_dev,
        sorted_token_ids=ids_dev,
        seg_starts=starts_dev,
        seg_lens=lens_dev,
        seg_slots=slots_dev,
        padded_rows=padded_dev,
        segments=segments,
        num_tokens=n_tok,
        max_seg_len=segs.max_len,
        max_slot=int(segs.slots[-1]) if n_seg else -1,
        path=path,
        backend=backend,
        deterministic=deterministic,
    )


def static_decode_batch(token_slots: torch.Tensor, deterministic: bool = False) -> LoRABatch:
    """A BGMV batch over a buffer of token slots (-1 = no adapter) that a CUDA graph reads
    on every replay: the Triton kernels look each token's slot up on the device, so the
    buffer's contents may change between replays while every launch stays the same.

    The host knows nothing of the slots, so the segment fields are stand-ins: one segment
    covering every token (the ops launch whenever it is non-empty), max_slot -1 (the caller
    fills the buffer with slots it holds). Triton only: the torch reference reads the
    segments on the host."""
    if not isinstance(token_slots, torch.Tensor) or token_slots.dim() != 1:
        raise ValueError("token_slots must be a 1-D tensor [num_tokens]")
    if token_slots.dtype != torch.int64 or token_slots.stride(0) != 1:
        raise ValueError(f"token_slots must be a contiguous int64 tensor, got {token_slots.dtype}")
    check_backend("triton", token_slots.device)
    n = token_slots.numel()
    none = token_slots.new_empty(0)
    return LoRABatch(
        token_slots=token_slots,
        sorted_token_ids=none,
        seg_starts=none,
        seg_lens=none,
        seg_slots=none,
        padded_rows=none,
        segments=((0, 0, n),) if n else (),
        num_tokens=n,
        max_seg_len=n,
        max_slot=-1,
        path="bgmv",
        backend="triton",
        deterministic=deterministic,
    )
