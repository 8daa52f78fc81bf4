"""Paged KV cache bookkeeping: which fixed-size block of the cache holds which tokens.

The cache itself is a pair of tensors per layer (see kv_cache.py); this class only hands
out block numbers. A sequence of n tokens holds ceil(n / block_size) blocks, listed in its
block table; token i lives in slot `block_table[i // block_size] * block_size + i % block_size`.
"""

from collections import deque

from .sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, seq: Sequence) -> bool:
        return self.blocks_needed(len(seq)) <= len(self.free_blocks)

    def allocate(self, seq: Sequence) -> None:
        """Give a waiting sequence blocks for every token it has (it is about to be prefilled)."""
        assert not seq.block_table, f"{seq} already holds blocks"
        need = self.blocks_needed(len(seq))
        assert need <= len(self.free_blocks), "allocate() without can_allocate()"
        seq.block_table = [self.free_blocks.popleft() for _ in range(need)]

    def can_append(self, seq: Sequence) -> bool:
        """Whether the sequence's newest token (fed in the next decode step) has a slot."""
        return self.blocks_needed(len(seq)) <= len(seq.block_table) or bool(self.free_blocks)

    def append_slot(self, seq: Sequence) -> None:
        if self.blocks_needed(len(seq)) > len(seq.block_table):
            seq.block_table.append(self.free_blocks.popleft())

    def free(self, seq: Sequence) -> None:
        self.free_blocks.extend(seq.block_table)
        seq.block_table = []
