"""One device pool for KV blocks and adapter slots, split by demand rather than at start.

The pool is a run of pages; a page is one KV block of every layer (keys and values), so
`page_bytes` is `kv_block_bytes`. Slot s of the LoRA slots owns the `pages_per_slot`
pages from s * pages_per_slot on (the slot groups sit at the bottom of the pool): while no
adapter sits in it, its pages are ordinary KV blocks; an adapter swapped in takes them
(lora/slot_allocator.py), and an idle one gives them back when the KV side needs them.
Every address is fixed at start, so CUDA graphs and the kernels' pointer tables stay valid.
At least one page stays outside the groups, so the last page (what a RELEASED table entry,
-1, names) is never an adapter's, and base-model requests always have a block.
"""

import heapq
from dataclasses import dataclass

from .errors import ConfigError

# On CPU without a memory budget, the pool gets the default KV cache plus room for this many
# slots (max_loras when set), so the default cache stays whole beside that many adapters.
CPU_DEFAULT_SLOTS = 4


def pages_per_slot(slot_bytes: int, page_bytes: int) -> int:
    """Pages one adapter slot row takes: ceil(slot_bytes / page_bytes)."""
    return -(-slot_bytes // page_bytes)


@dataclass(frozen=True)
class PoolLayout:
    """Where the slot groups lie among the pool's `num_pages` KV pages (the decode graphs'
    padding page, when there is one, comes after them and belongs to nobody)."""

    num_pages: int  # pages the block manager hands out
    num_slots: int  # S: adapter slots (an upper bound on adapters in device memory)
    pages_per_slot: int  # k

    def slot_pages(self, slot: int) -> range:
        start = slot * self.pages_per_slot
        return range(start, start + self.pages_per_slot)

    def slot_of(self, page: int) -> int | None:
        """The slot whose group holds a page; None for a page outside every group."""
        if self.pages_per_slot == 0 or page >= self.num_slots * self.pages_per_slot:
            return None
        return page // self.pages_per_slot

    def take_rank(self, page: int) -> tuple[int, int]:
        """The order free pages are handed to the KV side, smallest first: pages outside
        every group, then the groups of the slots the allocator fills last (the highest)."""
        slot = self.slot_of(page)
        return (0, page) if slot is None else (self.num_slots - slot, page)


def plan_slots(
    num_pages: int, k: int, max_loras: int | None, max_cpu_loras: int, budget_note: str
) -> int:
    """The slot count: `max_loras` when the operator set it, else as many as the pool holds,
    up to the host cache's size (which should hold at least the device's adapters). Many
    slots cost the KV side nothing while idle: an idle adapter's pages go back to it on
    demand. Either way at least one page stays outside the groups, so base-model requests
    always have a block."""
    fits = (num_pages - 1) // k if k else 0
    if max_loras is not None:
        if max_loras > fits:
            raise ConfigError(
                f"{budget_note} holds {num_pages} pages of KV cache; the {max_loras} LoRA slots "
                f"take {k} pages each ({max_loras * k} in all) but no KV block would be left "
                f"beside them; raise kv_cache_bytes (or leave it unset to size it from the "
                f"model) or lower max_loras / max_lora_rank"
            )
        return max_loras
    slots = min(fits, max_cpu_loras)
    if slots < 1:
        raise ConfigError(
            f"{budget_note} holds {num_pages} pages of KV cache; one LoRA slot takes {k} pages "
            f"and would leave no KV block beside it; raise kv_cache_bytes or lower max_lora_rank"
        )
    return slots


class FreePages:
    """The free pages, handed out in the layout's order (PoolLayout.take_rank): a heap with
    lazy deletion, so a page taken by an adapter simply leaves the member set."""

    def __init__(self, layout: PoolLayout):
        self.rank = layout.take_rank
        self.members: set[int] = set(range(layout.num_pages))
        self.heap = sorted((self.rank(p), p) for p in self.members)

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, page: int) -> bool:
        return page in self.members

    def append(self, page: int) -> None:
        assert page not in self.members, f"page {page} is free already"
        self.members.add(page)
        heapq.heappush(self.heap, (self.rank(page), page))

    def take(self) -> int:
        """The free page to use first."""
        while True:
            _, page = heapq.heappop(self.heap)
            if page in self.members:
                self.members.remove(page)
                return page

    def remove(self, page: int) -> None:
        self.members.remove(page)
