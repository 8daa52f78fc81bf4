"""Every tiling the tile table can give the kernels computes the op, checked against the torch
reference under Triton's interpreter (tiny shapes, fp32): each distinct default choice, and
each field's smallest and largest allowed value, on one or two launches with merged slices.
"""

import dataclasses

import pytest
import torch

from inference.kernels import lora_expand, lora_shrink, make_lora_batch
from inference.kernels.lora_tiles import DEFAULT_TABLE, LIMITS, Tiles
from tests.kernels.factories import make_weights, prefill_slots

# The fields each op/path reads; the others are ignored by its kernel.
USED = {
    ("shrink", "sgmv"): ("block_m", "block_k", "split_k", "num_warps", "num_stages"),
    ("shrink", "bgmv"): ("block_k", "split_k", "num_warps", "num_stages"),
    ("expand", "sgmv"): ("block_m", "block_n", "num_warps", "num_stages"),
    ("expand", "bgmv"): ("block_n", "num_warps", "num_stages"),
}
IN_FEATURES = 600  # over two 256-wide K tiles, so the widest split still splits
WIDTHS = [300, 24]  # a merged projection: two slices, one over two 128-wide N tiles


def _used(op: str, path: str, tiles: Tiles) -> Tiles:
    """`tiles` with the fields the op/path ignores reset, so equal launches compare equal."""
    unused = set(LIMITS) - set(USED[(op, path)])
    return dataclasses.replace(tiles, **{f: getattr(Tiles(), f) for f in unused})


def _choices() -> list[tuple[str, str, int, Tiles]]:
    """(op, path, rank, tiles): each distinct default per op/path and rank's tile height,
    then every field at its smallest and at its largest allowed value."""
    seen, choices = set(), []
    for (op, path, rank, _, _), tiles in DEFAULT_TABLE.entries.items():
        key = (op, path, max(16, rank), _used(op, path, tiles))
        if key not in seen:
            seen.add(key)
            choices.append((op, path, rank, key[3]))
    for op, path in USED:
        for end in (0, 1):
            extreme = {f: LIMITS[f][end] for f in USED[(op, path)]}
            choices.append((op, path, 16, dataclasses.replace(Tiles(), **extreme)))
    return choices


CHOICES = _choices()


def _slots(path: str) -> torch.Tensor:
    if path == "bgmv":
        return torch.tensor([2, -1, 0, 2, 1])
    return prefill_slots([70, 4, 9], [1, -1, 0])  # one segment over several token blocks


@pytest.mark.parametrize(
    ("op", "path", "rank", "tiles"),
    CHOICES,
    ids=[f"{op}-{path}-r{rank}-{i}" for i, (op, path, rank, _) in enumerate(CHOICES)],
)
def test_tiling_matches_the_reference(op, path, rank, tiles):
    from inference.kernels import lora_triton

    token_slots = _slots(path)
    ranks = [rank, max(1, rank // 2), 0]
    lora_a, lora_b, scales = make_weights(3, IN_FEATURES, WIDTHS, ranks, max_rank=rank)
    active = token_slots >= 0
    t, n = len(token_slots), len(WIDTHS)
    x = torch.randn(t, IN_FEATURES)
    y_in = torch.randn(n, t, rank)
    out_in = torch.randn(t, sum(WIDTHS))
    results = []
    for backend in ("triton", "torch"):
        batch = make_lora_batch(token_slots, backend=backend, path=path)
        if op == "shrink":
            y = torch.full((n, t, rank), float("nan"))
            if backend == "triton":
                lora_triton.lora_shrink(x, lora_a, batch, y, tiles)
            else:
                lora_shrink(x, lora_a, batch, y)
            results.append(y[:, active])
        else:
            out = out_in.clone()
            if backend == "triton":
                lora_triton.lora_expand(y_in, lora_b, scales, batch, out, True, tiles)
            else:
                lora_expand(y_in, lora_b, scales, batch, out)
            results.append(out)
    torch.testing.assert_close(results[0], results[1], rtol=1e-5, atol=1e-5)


def test_every_launch_takes_its_tiles_from_the_table():
    from inference.kernels import lora_triton

    batch = make_lora_batch(prefill_slots([70, 9], [1, 0]), backend="triton")
    got = lora_triton.launch_tiles("shrink", batch, 16, 4096, batch.device, None)
    assert got == DEFAULT_TABLE.lookup("shrink", "sgmv", 16, 4096, 79)
    decode = make_lora_batch(torch.tensor([0, 1, 2]), backend="triton")
    got = lora_triton.launch_tiles("expand", decode, 16, 4096, decode.device, None)
    assert got == DEFAULT_TABLE.lookup("expand", "bgmv", 16, 4096, 3)


def test_launch_fits_a_tiling_to_the_batch():
    from inference.kernels import lora_triton

    short = make_lora_batch(prefill_slots([5, 9], [1, 0]), backend="triton", path="sgmv")
    tiles = Tiles(block_m=128, block_k=256, split_k=64)
    fitted = lora_triton.launch_tiles("shrink", short, 16, 600, short.device, tiles)
    assert (fitted.block_m, fitted.split_k) == (16, 3)  # the 9-token segment; 600 = 3 K tiles
    decode = make_lora_batch(torch.tensor([0, 1]), backend="triton", path="bgmv")
    assert lora_triton.launch_tiles("expand", decode, 16, 600, decode.device, tiles) == (
        dataclasses.replace(tiles, split_k=1)
    )
