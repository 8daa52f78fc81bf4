"""The emulated device's sampled tokens: a function of the sequence's seed and length only,
so runs repeat, and never an end-of-sequence token, so a request runs to its max_tokens as a
benchmark's `ignore_eos` would (a GPU's model decides when to stop; the emulation cannot)."""

from ..sequence import Sequence

_STRIDE = 7919  # a prime: consecutive positions land far apart in the vocabulary


def rule_token(seq: Sequence, vocab_size: int, ends: frozenset[int]) -> int:
    """`ends`: the model's end-of-sequence tokens; the request's stop tokens are avoided too."""
    avoid = ends | frozenset(seq.params.stop_token_ids)
    token = (seq.seed * 1_000_003 + len(seq) * _STRIDE) % vocab_size
    while token in avoid:
        token = (token + 1) % vocab_size
    return token
