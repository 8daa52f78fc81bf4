"""The LoRA slots of an emulated device. They are laid out for the served model on the meta
device: the host's part (packing an adapter into a slot row, each step's LoRA metadata) runs
for real, the device memory is only accounted. A write takes the device as long as the
emulated model's adapter of the same rank and targets takes over the host link."""

from typing import Any

import torch

from ..lora.slots import HostAdapter, LoRASlots
from ..planning.step_time import ACTIVATION_BYTES, StepTimeModel
from .device import EmulatedDevice


class EmulatedLoRASlots(LoRASlots):
    def __init__(self, *args: Any, clock: EmulatedDevice, cost: StepTimeModel, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.clock = clock
        self.cost = cost
        self.ranks: dict[int, int] = {}  # slot -> its adapter's largest rank
        self.swap_in_seconds = 0.0  # the device's time spent on adapter copies

    def write(self, slot: int, adapter: HostAdapter) -> None:
        super().write(slot, adapter)
        rank = adapter.spec.max_rank or adapter.spec.rank
        self.ranks[slot] = rank
        emulated = emulated_adapter_bytes(self.cost, rank, adapter.spec.target_modules)
        seconds = self.cost.copy_seconds(emulated)
        self.swap_in_seconds += seconds
        self.clock.run(seconds, step=False)

    def clear(self, slot: int) -> None:
        super().clear(slot)
        self.ranks.pop(slot, None)

    def step_ranks(self, token_slots: list[int]) -> tuple[tuple[int, ...], int]:
        """The ranks of the distinct adapters a step's tokens use, and how many tokens do."""
        used = sorted({s for s in token_slots if s >= 0})
        return tuple(self.ranks.get(s, self.max_rank) for s in used), sum(
            s >= 0 for s in token_slots
        )


def emulated_adapter_bytes(cost: StepTimeModel, rank: int, targets: tuple[str, ...]) -> int:
    """One rank's share of the emulated model's adapter: A and B of every target linear."""
    per_layer = sum(fan_in + fan_out for name, (fan_in, fan_out) in cost.linears.items()
                    if name in targets)  # fmt: skip
    return cost.mc.num_layers * per_layer * rank * ACTIVATION_BYTES


def meta_rows(slots: LoRASlots, num_slots: int) -> torch.Tensor:
    """The slots' rows: accounted in the emulated pool's pages, held nowhere."""
    return torch.zeros(num_slots, slots.slot_numel, dtype=slots.dtype, device="meta")
