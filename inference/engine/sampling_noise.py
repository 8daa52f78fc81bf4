"""Counter-based random numbers for sampling: a pure function of (seed, step).

No generator objects and no state: the number a row gets depends only on its request's seed
and the index of the token being sampled, so a seeded request draws the same whatever shares
its batch and in whatever row, a preempted request redraws what it drew before, and the same
number comes out on CPU and CUDA. Everything is int64 tensor arithmetic (wrap-around
multiply, xor, shifts), so it runs on the device inside a CUDA graph with no host
synchronisation. One number per row, not one per vocabulary entry: on a CPU, hashing every
entry of a 49k vocabulary for a batch of 64 cost more than the rest of the step's host work.

The hash is splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
generators", 2014): a row's key mixes its seed and step, and its uniform is the first output
of the splitmix64 stream started at that key.
"""

import torch

_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 that holds it (torch has no uint64 arithmetic)."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GAMMA = _signed(0x9E3779B97F4A7C15)  # splitmix64's increment: 2**64 / golden ratio, odd
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)
_UNIFORM_BITS = 52  # (2k + 1) / 2**53 is exact in float64 for k < 2**52


def as_int64_seed(seed: int) -> int:
    """Any Python integer seed as an int64 (seeds equal modulo 2**64 draw the same)."""
    return _signed(seed)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 patterns (torch's >> is arithmetic: it copies the sign)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser: a bijection on 64-bit patterns in which every input bit
    flips about half the output bits."""
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    return x ^ _shift_right(x, 31)


def row_keys(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One key per row ([rows] int64) from its seed and the index of the token it samples."""
    return mix64(mix64(seeds + _GAMMA) + steps)


def uniform(keys: torch.Tensor) -> torch.Tensor:
    """[rows] float64 uniforms in (0, 1), never 0 or 1: 52 random bits each."""
    bits = _shift_right(mix64(keys + _GAMMA), 64 - _UNIFORM_BITS)
    return (bits * 2 + 1).to(torch.float64) * 2.0 ** -(_UNIFORM_BITS + 1)
