"""The Triton kernels, run by Triton's interpreter on CPU, against the torch reference.

The interpreter is slow (tenths of a second per launch) and gets bf16 arithmetic wrong, so
shapes stay small and dtypes are fp32 and fp16. What it cannot check (tile sizes a GPU
rejects, tf32 dots) is covered by bench/gpu_lora.py on a GPU. Its atomics run one after
another, so the deterministic mode is checked by what it launches (no split) and its result.
"""

import pytest
import torch

from inference.kernels import add_lora, lora_expand, lora_shrink, make_lora_batch
from inference.kernels.lora_batch import static_decode_batch
from inference.kernels.lora_tiles import Tiles
from tests.kernels.factories import decode_slots, make_weights, prefill_slots

SLOTS = 5
RANKS = [16, 8, 4, 0, 8]  # padded to a stacked rank of 16; slot 3 is empty

CASES = {
    "one-token": (torch.tensor([2]), 32, [32]),
    "decode-qkv": (decode_slots(17, SLOTS), 64, [64, 16, 16]),
    "unsorted-gate-up": (torch.tensor([4, -1, 0, 4, 1, -1, 2]), 40, [96, 96]),
    "prefill-qkv": (prefill_slots([23, 1, 16], [1, -1, 4]), 96, [48, 24, 24]),
    "long-segment": (prefill_slots([70], [0]), 48, [40]),  # two token blocks of one slot
    "wide-input": (torch.tensor([0, 2, 0]), 300, [24]),  # reduction split over programs
}
# 70 one-token programs per slice are slow in the interpreter; decode covers that path.
FP32_RUNS = [(c, p) for c in CASES for p in ("sgmv", "bgmv") if (c, p) != ("long-segment", "bgmv")]


def _pair(token_slots, in_features, widths, path, dtype=torch.float32):
    """(out from Triton, out from torch) for one add_lora call on the same inputs."""
    lora_a, lora_b, scales = make_weights(SLOTS, in_features, widths, RANKS, dtype=dtype)
    x = torch.randn(len(token_slots), in_features).to(dtype)
    out = torch.randn(len(token_slots), sum(widths)).to(dtype)
    outs = []
    for backend in ("triton", "torch"):
        batch = make_lora_batch(token_slots, backend=backend, path=path)
        o = out.clone()
        add_lora(o, x, lora_a, lora_b, scales, batch)
        outs.append(o)
    return outs


@pytest.mark.parametrize(("case", "path"), FP32_RUNS)
def test_triton_matches_reference_in_fp32(case, path):
    triton_out, torch_out = _pair(*CASES[case], path)
    torch.testing.assert_close(triton_out, torch_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["sgmv", "bgmv"])
def test_triton_matches_reference_in_fp16(path):
    triton_out, torch_out = _pair(*CASES["unsorted-gate-up"], path, dtype=torch.float16)
    torch.testing.assert_close(triton_out, torch_out, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("path", ["sgmv", "bgmv"])
def test_triton_matches_reference_in_bf16_within_one_ulp(path):
    # The kernels compute bf16 tiles in fp32; the interpreter then truncates on the cast back
    # where a GPU rounds, so one bf16 ulp (2**-8 relative) of difference is expected here.
    triton_out, torch_out = _pair(*CASES["unsorted-gate-up"], path, dtype=torch.bfloat16)
    torch.testing.assert_close(triton_out, torch_out, rtol=2**-7, atol=2**-7)


def test_default_path_is_segments_for_prefill_and_per_token_for_decode():
    assert make_lora_batch(CASES["prefill-qkv"][0], backend="triton").path == "sgmv"
    assert make_lora_batch(torch.tensor([0, 1, 2, -1]), backend="triton").path == "bgmv"


@pytest.mark.parametrize("path", ["sgmv", "bgmv"])
def test_shrink_and_expand_each_match_reference(path):
    token_slots, in_features, widths = CASES["unsorted-gate-up"]
    lora_a, lora_b, scales = make_weights(SLOTS, in_features, widths, RANKS)
    x = torch.randn(len(token_slots), in_features)
    active = token_slots >= 0
    # One y for both expands, with NaN rows for tokens without an adapter: the kernels must
    # never read them.
    y_in = torch.randn(2, len(token_slots), 16)
    y_in[:, ~active] = float("nan")
    ys, outs = [], []
    for backend in ("triton", "torch"):
        batch = make_lora_batch(token_slots, backend=backend, path=path)
        y = torch.zeros(2, len(token_slots), 16)
        lora_shrink(x, lora_a, batch, y)
        ys.append(y[:, active])
        out = torch.zeros(len(token_slots), sum(widths))
        lora_expand(y_in, lora_b, scales, batch, out, add=False)
        outs.append(out)
    torch.testing.assert_close(ys[0], ys[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    assert not outs[0].isnan().any()


def test_non_contiguous_inputs_and_slices_with_different_layouts():
    """x as a column view of a wider tensor, one B slice transposed in memory: two launches."""
    token_slots = torch.tensor([1, 0, 1, -1, 2])
    lora_a, lora_b, scales = make_weights(3, 32, [32, 16], [16, 8, 4])
    lora_b[1] = lora_b[1].transpose(1, 2).contiguous().transpose(1, 2)
    x = torch.randn(5, 48)[:, 8:40]
    outs = []
    for backend in ("triton", "torch"):
        out = torch.randn(5, 48, generator=torch.Generator().manual_seed(1))
        add_lora(out, x, lora_a, lora_b, scales, make_lora_batch(token_slots, backend=backend))
        outs.append(out)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["sgmv", "bgmv"])
def test_shrink_into_a_half_precision_buffer_matches_reference(path):
    token_slots, in_features, widths = CASES["unsorted-gate-up"]
    lora_a, _, _ = make_weights(SLOTS, in_features, widths, RANKS, dtype=torch.float16)
    x = torch.randn(len(token_slots), in_features).half()
    active = token_slots >= 0
    ys = []
    for backend in ("triton", "torch"):
        y = torch.zeros(2, len(token_slots), 16, dtype=torch.float16)
        lora_shrink(x, lora_a, make_lora_batch(token_slots, backend=backend, path=path), y)
        ys.append(y[:, active])
    torch.testing.assert_close(ys[0], ys[1], rtol=2e-3, atol=2e-3)


def _split_shrink(deterministic, path):
    """Two Triton shrinks whose tiles split K four ways, the torch reference's result, and
    the split the launches used."""
    from inference.kernels import lora_triton

    token_slots, in_features, widths = CASES["wide-input"]
    lora_a, _, _ = make_weights(SLOTS, in_features, widths, RANKS)
    x = torch.randn(len(token_slots), in_features)
    tiles = Tiles(block_k=32, split_k=4)
    ys = []
    for backend in ("triton", "triton", "torch"):
        batch = make_lora_batch(token_slots, backend=backend, path=path,
                                deterministic=deterministic)  # fmt: skip
        y = torch.zeros(len(widths), len(token_slots), 16)
        if backend == "triton":
            lora_triton.lora_shrink(x, lora_a, batch, y, tiles)
        else:
            lora_shrink(x, lora_a, batch, y)
        ys.append(y)
    batch = make_lora_batch(token_slots, backend="triton", path=path, deterministic=deterministic)
    fitted = lora_triton.launch_tiles("shrink", batch, 16, in_features, x.device, tiles)
    return ys, fitted.split_k


@pytest.mark.parametrize("path", ["sgmv", "bgmv"])
def test_deterministic_batches_never_split_and_repeat_bit_for_bit(path):
    (first, second, reference), split_k = _split_shrink(True, path)
    assert split_k == 1  # even where the tiles ask for a split
    assert torch.equal(first, second)
    torch.testing.assert_close(first, reference, rtol=1e-5, atol=1e-5)


def test_without_the_setting_the_split_stands():
    (first, _, reference), split_k = _split_shrink(False, "sgmv")
    assert split_k == 4
    torch.testing.assert_close(first, reference, rtol=1e-5, atol=1e-5)


def test_a_cuda_graph_decode_batch_can_be_deterministic():
    from inference.kernels import lora_triton

    tiles = Tiles(block_k=32, split_k=4)
    for deterministic, split_k in ((False, 4), (True, 1)):
        batch = static_decode_batch(torch.tensor([0, -1, 2]), deterministic)
        fitted = lora_triton.launch_tiles("shrink", batch, 16, 256, batch.device, tiles)
        assert fitted.split_k == split_k
