"""Paged KV cache bookkeeping: which fixed-size block of the cache holds which tokens, and
which blocks can be shared between requests (automatic prefix caching).

The cache itself is a pair of tensors per layer (see kv_cache.py); this class only hands
out block numbers. A sequence of n tokens holds ceil(n / block_size) blocks, listed in its
block table; token i lives in slot `block_table[i // block_size] * block_size + i % block_size`.

Prefix caching: a full block is named by a hash chain over the adapter the keys and values
were computed with (see `chain_root`), the previous block's hash and the block's own token
ids, so a name covers the whole prefix up to the block's end. A block gets its name when
a step is scheduled to fill it (`commit`), so a request admitted in the same step can
already read it: every layer stores the step's keys and values before any token attends.
Blocks are reference-counted; one nobody holds keeps its name and contents in an LRU pool
and is reused for a new request with the same prefix, or taken for other tokens, least
recently used first, when no plain free block is left.

The memory pool (memory_pool.py): blocks are the pool's pages, and the pages of an adapter
slot's group are lent to the LoRA slots while an adapter sits there (`lend`, `give_back`).
Plain free pages are handed out outside every group first. When no plain or cached block
is left, the `lender` (the LoRA manager) gives back the pages of an idle adapter; the
capacity checks count those pages as available.
"""

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from .memory_pool import FreePages, PoolLayout
from .model.rotary import uses_long_factors
from .sequence import Sequence

# A block table entry let go behind a sliding window. As an index it names the last block:
# real, finite memory (the cache starts zeroed), which attention masks out.
RELEASED = -1


@dataclass
class BlockManagerStats:
    """Cumulative prefix-cache counts, in prompt tokens, as vLLM counts them."""

    queries: int = 0  # tokens of admitted prompts looked up
    hits: int = 0  # of those, tokens whose keys and values were found in the cache


class PageLender(Protocol):
    """Who holds pages the KV side may ask back: the LoRA manager's idle adapters."""

    def reclaimable_pages(self) -> int:
        """Pages idle adapters would give back if asked."""
        ...

    def reclaim_pages(self) -> bool:
        """Evict one idle adapter, giving its pages back (`give_back`); False if none."""
        ...


class Block:
    __slots__ = ("adapter_id", "hash", "ref_count")

    def __init__(self) -> None:
        self.ref_count = 0
        self.hash: bytes | None = None  # its name while its contents can be shared
        self.adapter_id: str | None = None  # the adapter its keys and values belong to


def chain_root(adapter_id: str | None, long_rope: bool = False) -> bytes:
    """Where a sequence's hash chain starts: keys and values depend on the adapter's
    weights, so blocks computed under one adapter (or the base model) never match another's;
    and under LongRoPE on which factors rotated them."""
    tag = b"base" if adapter_id is None else b"adapter:" + adapter_id.encode()
    if long_rope:
        tag += b"|longrope"
    return hashlib.blake2b(tag, digest_size=16).digest()


def block_hash(parent: bytes, token_ids: list[int]) -> bytes:
    """The name of a full block: 128 bits of BLAKE2 over its parent's name and its tokens,
    so equal names mean equal prefixes (a collision is as likely as guessing a 128-bit key)."""
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        sliding_window: int | None = None,
        longrope_original: int | None = None,
        layout: PoolLayout | None = None,
        reserve_slots: bool = False,
    ):
        self.layout = layout if layout is not None else PoolLayout(num_blocks, 0, 0)
        assert self.layout.num_pages == num_blocks
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # Set when every layer attends through this window: blocks that fall behind it are
        # never read again and go back to the pool while the sequence runs on.
        self.sliding_window = sliding_window
        # LongRoPE: a sequence longer than this rotates with the long factors (long_rope)
        self.longrope_original = longrope_original
        self.blocks = [Block() for _ in range(num_blocks)]
        self.free_blocks = FreePages(self.layout)  # hold nothing worth keeping
        self.cached_free: OrderedDict[int, None] = OrderedDict()  # named, unheld; LRU first
        self.by_hash: dict[bytes, int] = {}
        self.stats = BlockManagerStats()
        self.lent: dict[int, range] = {}  # slot -> its group's pages, lent to its adapter
        # a fixed split: every slot group is its slot's from the start and never a KV block
        self.slots_reserved = reserve_slots
        if reserve_slots:
            for slot in range(self.layout.num_slots):
                self.lent[slot] = self.layout.slot_pages(slot)
                for page in self.lent[slot]:
                    self.free_blocks.remove(page)
        self.lender: PageLender | None = None
        self.holders: dict[int, Sequence] = {}  # id -> sequences holding blocks
        self.pages_moved = 0  # blocks moved out of a slot group for an adapter

    @property
    def num_free_blocks(self) -> int:
        """Blocks the KV side has without asking an adapter for its pages."""
        return len(self.free_blocks) + len(self.cached_free)

    @property
    def num_available_blocks(self) -> int:
        """Free blocks and the pages idle adapters would give back."""
        reclaimable = self.lender.reclaimable_pages() if self.lender is not None else 0
        return self.num_free_blocks + reclaimable

    @property
    def num_lent_pages(self) -> int:
        return sum(len(pages) for pages in self.lent.values())

    def max_seq_blocks(self, with_adapter: bool = False, pinned: int = 0) -> int:
        """The most blocks one sequence can ever hold: the whole pool, less its adapter's
        slot group when it has one and the groups `pinned` adapters keep (less every group
        when the slots are reserved)."""
        if self.slots_reserved:
            return self.num_blocks - self.num_lent_pages
        return self.num_blocks - self.layout.pages_per_slot * (pinned + with_adapter)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by requests."""
        return self.num_blocks - self.num_free_blocks - self.num_lent_pages

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that hold a named prefix, held by a request or not."""
        return len(self.by_hash)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- admission ------------------------------------------------------------------------

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """The blocks holding the longest cached prefix of the sequence. Never its last
        token: that one is always computed, for the logits of the next."""
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return []  # prompt logprobs need the logits of every prompt token
        hits: list[int] = []
        for h in self.hashes(seq)[: (len(seq) - 1) // self.block_size]:
            block_id = self.by_hash.get(h)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def can_allocate(self, seq: Sequence, cached: list[int]) -> bool:
        """Whether the sequence can have blocks for all its tokens, reusing `cached`."""
        need = self.blocks_needed(len(seq)) - len(cached)
        unheld_hits = sum(1 for b in cached if self.blocks[b].ref_count == 0)
        return need + unheld_hits <= self.num_available_blocks

    def allocate(self, seq: Sequence, cached: list[int]) -> None:
        """Give a waiting sequence blocks for every token it has: the cached prefix's blocks
        shared, fresh ones for the rest. Its computed tokens start after the prefix."""
        assert not seq.block_table, f"{seq} already holds blocks"
        assert self.can_allocate(seq, cached), "allocate() without can_allocate()"
        for block_id in cached:
            self._hold(block_id)
        fresh = [self._take() for _ in range(self.blocks_needed(len(seq)) - len(cached))]
        seq.block_table = cached + fresh
        self.holders[id(seq)] = seq
        seq.cached_long_rope = self.long_rope(seq)
        seq.num_computed_tokens = seq.num_cached_tokens = len(cached) * self.block_size
        self.stats.queries += len(seq)
        self.stats.hits += seq.num_cached_tokens

    # -- running --------------------------------------------------------------------------

    def can_append(self, seq: Sequence) -> bool:
        """Whether the sequence's newest token (fed in the next decode step) has a slot."""
        return self.blocks_needed(len(seq)) <= len(seq.block_table) or self.num_available_blocks > 0

    def append_slot(self, seq: Sequence) -> None:
        if self.blocks_needed(len(seq)) > len(seq.block_table):
            seq.block_table.append(self._take())

    def commit(self, seq: Sequence, num_tokens: int) -> None:
        """Name the blocks the first `num_tokens` tokens fill, once a step is scheduled to
        compute them. A block whose prefix another block already holds stays unnamed."""
        if not self.enable_prefix_caching:
            return
        hashes = self.hashes(seq)
        full = min(num_tokens // self.block_size, len(seq.block_table))
        adapter_id = _adapter_id(seq)
        for i in range(seq.num_committed_blocks, full):
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and hashes[i] not in self.by_hash:
                block.hash, block.adapter_id = hashes[i], adapter_id
                self.by_hash[hashes[i]] = seq.block_table[i]
        seq.num_committed_blocks = max(seq.num_committed_blocks, full)

    def long_rope(self, seq: Sequence) -> bool:
        """Whether the sequence's tokens now rotate with LongRoPE's long factors: once it
        is longer than the original context, as transformers rotates a whole sequence."""
        return uses_long_factors(len(seq), self.longrope_original)

    def needs_recompute(self, seq: Sequence) -> bool:
        """A running sequence whose cached keys were rotated with the short factors and
        which has just grown past the original context: transformers then recomputes the
        whole sequence with the long factors, and so must we."""
        return seq.cached_long_rope is False and self.long_rope(seq)

    def release_behind_window(self, seq: Sequence) -> None:
        """Let go of the blocks whose every token lies behind the sliding window of every
        token still to come (the next query, at num_computed_tokens, sees keys from
        num_computed_tokens - window + 1 on). Their table entries become RELEASED: a
        reference attention may still gather, harmlessly, since it masks those positions."""
        if self.sliding_window is None:
            return
        first_seen = seq.num_computed_tokens - self.sliding_window + 1
        behind = max(0, first_seen // self.block_size)
        for i in range(seq.num_released_blocks, min(behind, len(seq.block_table))):
            self._release(seq.block_table[i])
            seq.block_table[i] = RELEASED
        seq.num_released_blocks = max(seq.num_released_blocks, behind)

    def free(self, seq: Sequence) -> None:
        """Let go of a sequence's blocks. Named ones stay cached; the tail goes first into
        the LRU pool's old end, so a prefix outlives what followed it."""
        for block_id in reversed(seq.block_table):
            if block_id != RELEASED:
                self._release(block_id)
        seq.block_table = []
        self.holders.pop(id(seq), None)
        seq.num_computed_tokens = seq.num_committed_blocks = seq.num_released_blocks = 0
        seq.cached_long_rope = None

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.hash is None:
                self.free_blocks.append(block_id)
            else:
                self.cached_free[block_id] = None

    def drop_adapter(self, adapter_id: str) -> int:
        """Forget every cached block computed under an adapter (it is being unloaded);
        the number of blocks dropped."""
        dropped = [b for b in self.by_hash.values() if self.blocks[b].adapter_id == adapter_id]
        for block_id in dropped:
            self._unname(block_id)
            if block_id in self.cached_free:
                del self.cached_free[block_id]
                self.free_blocks.append(block_id)
        return len(dropped)

    def hashes(self, seq: Sequence) -> list[bytes]:
        """The names of the sequence's full blocks, extended as its tokens grow (its tokens
        only ever grow, so the names computed once stay right)."""
        root = chain_root(_adapter_id(seq), self.long_rope(seq))
        if seq.hash_root != root:  # a first call, or LongRoPE switched: other names
            seq.block_hashes, seq.hash_root = [], root
        hashes = seq.block_hashes
        full = len(seq) // self.block_size
        if len(hashes) < full:
            parent = hashes[-1] if hashes else root
            for i in range(len(hashes), full):
                parent = block_hash(
                    parent, seq.token_ids[i * self.block_size : (i + 1) * self.block_size]
                )
                hashes.append(parent)
        return hashes

    # -- blocks ---------------------------------------------------------------------------

    def _hold(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.cached_free[block_id]
        block.ref_count += 1

    def _take(self) -> int:
        """A block for new tokens: a plain free one, else the least recently used cached one,
        else a page an idle adapter gives back."""
        while not self.num_free_blocks:
            reclaimed = self.lender is not None and self.lender.reclaim_pages()
            assert reclaimed, "no block to take: the capacity check counted what is not there"
        block_id = self._take_unheld()
        self.blocks[block_id].ref_count = 1
        return block_id

    def _take_unheld(self) -> int:
        if self.free_blocks:
            return self.free_blocks.take()
        block_id, _ = self.cached_free.popitem(last=False)
        self._unname(block_id)
        return block_id

    # -- pages lent to adapter slots --------------------------------------------------------

    def held_in(self, pages: Iterable[int]) -> int:
        """How many of the pages hold blocks that requests hold."""
        return sum(1 for p in pages if self.blocks[p].ref_count > 0)

    def cached_in(self, pages: Iterable[int]) -> int:
        """How many of the pages hold cached prefixes that nobody holds."""
        return sum(1 for p in pages if p in self.cached_free)

    def can_lend(self, pages: range) -> bool:
        """Whether the group's held blocks fit in free or cached pages outside it."""
        outside = len(self.free_blocks) + len(self.cached_free)
        outside -= sum(1 for p in pages if p in self.free_blocks or p in self.cached_free)
        return self.held_in(pages) <= outside

    def lend(self, slot: int, pages: range) -> list[tuple[int, int]]:
        """Hand a slot group's pages to its adapter: free ones at no cost, cached prefixes
        nobody holds forgotten, held blocks moved to pages outside the group (their
        sequences' tables and the prefix map follow). The (src, dst) page copies to make,
        in order, before the adapter's weights overwrite the group."""
        assert slot not in self.lent and self.can_lend(pages)
        for page in pages:
            if page in self.free_blocks:
                self.free_blocks.remove(page)
            elif page in self.cached_free:
                del self.cached_free[page]
                self._unname(page)
        moved: dict[int, int] = {}
        for page in pages:
            if self.blocks[page].ref_count > 0:
                moved[page] = self._move(page)
        if moved:
            for seq in self.holders.values():
                seq.block_table = [moved.get(b, b) for b in seq.block_table]
            self.pages_moved += len(moved)
        self.lent[slot] = pages
        return list(moved.items())

    def _move(self, page: int) -> int:
        """A held block's bookkeeping to an unheld page outside every lent group."""
        dst = self._take_unheld()
        old, new = self.blocks[page], self.blocks[dst]
        new.ref_count, new.hash, new.adapter_id = old.ref_count, old.hash, old.adapter_id
        if old.hash is not None and self.by_hash.get(old.hash) == page:
            self.by_hash[old.hash] = dst
        old.ref_count, old.hash, old.adapter_id = 0, None, None
        return dst

    def give_back(self, slot: int) -> None:
        """An adapter left its slot: the group's pages are plain free blocks again (reserved
        slots keep theirs)."""
        if self.slots_reserved:
            return
        for page in self.lent.pop(slot):
            self.free_blocks.append(page)

    def _unname(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.hash is not None and self.by_hash.get(block.hash) == block_id:
            del self.by_hash[block.hash]
        block.hash = block.adapter_id = None


def _adapter_id(seq: Sequence) -> str | None:
    return seq.lora_request.adapter_id if seq.lora_request is not None else None
