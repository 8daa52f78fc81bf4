"""Token masks of constrained rows: each matcher's allowed tokens, applied to the logits.

One bitmask for all constrained rows of a step, filled by llguidance in parallel, then
unpacked on the logits' device in one gather: each byte of the mask picks its row of a
256 x 8 table of 0 and -inf, added to the logits (an allowed logit plus 0 is unchanged,
bit for bit). Rows without a grammar are not touched.
"""

import torch

from .grammar import GrammarMatcher

_TABLES: dict[torch.device, torch.Tensor] = {}


def mask_logits(
    logits: torch.Tensor, rows: list[int], matchers: list[GrammarMatcher]
) -> torch.Tensor:
    """A copy of `logits` ([rows, vocab]) in which each of `rows` allows only what its
    matcher allows; `logits` itself is left as it was (logprobs come from it)."""
    bitmask = matchers[0].backend.fill_bitmask([m.matcher for m in matchers])
    return apply_bitmask(logits, rows, bitmask)


def apply_bitmask(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> torch.Tensor:
    """`logits` with -inf where row `rows[i]` of it has a 0 bit in `bitmask[i]` (int32 words,
    bit j of word w for token 32 * w + j), as a new tensor."""
    table = _TABLES.get(logits.device)
    if table is None:
        bits = (torch.arange(256)[:, None] >> torch.arange(8)) & 1
        table = torch.zeros(256, 8).masked_fill_(bits == 0, float("-inf")).to(logits.device)
        _TABLES[logits.device] = table
    # int32 words are little-endian: byte b of a row holds tokens 8 * b .. 8 * b + 7
    byte_ids = bitmask.view(torch.uint8).to(logits.device, torch.long)
    bias = torch.nn.functional.embedding(byte_ids, table).view(len(rows), -1)
    bias = bias[:, : logits.shape[-1]]
    if len(rows) == logits.shape[0]:
        return logits + bias
    index = torch.tensor(rows, device=logits.device)
    return logits.clone().index_add_(0, index, bias)  # rows are distinct: one add each
