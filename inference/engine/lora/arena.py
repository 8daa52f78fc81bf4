"""Device memory for what only some adapters carry (DoRA scales, LoRA on embed_tokens /
lm_head, whole saved heads): one tensor reserved at start-up, so the KV budget counts it,
and handed out per slot in pieces, first fit. A slot row has the same size for every
adapter; these pieces cost memory only while an adapter that has them sits in a slot.
"""

import torch


class ExtrasArena:
    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device):
        self.data = torch.zeros(numel, dtype=dtype, device=device)
        self.capacity = numel
        self._free: list[tuple[int, int]] = [(0, numel)] if numel else []  # (start, length)
        self._used: dict[int, int] = {}  # start -> length

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    @property
    def used(self) -> int:
        return sum(self._used.values())

    def numel_at(self, start: int) -> int:
        return self._used[start]

    def fits(self, numel: int) -> bool:
        return any(length >= numel for _, length in self._free)

    def alloc(self, numel: int) -> int | None:
        """The start of a free piece of `numel` elements, or None if no gap is that large."""
        for i, (start, length) in enumerate(self._free):
            if length >= numel:
                if length == numel:
                    del self._free[i]
                else:
                    self._free[i] = (start + numel, length - numel)
                self._used[start] = numel
                return start
        return None

    def release(self, start: int) -> None:
        length = self._used.pop(start)
        self._free.append((start, length))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for s, n in self._free:  # join neighbours, so freed pieces add up again
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((s, n))
        self._free = merged
