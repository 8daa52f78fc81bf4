"""The torch reference (CPU backend, and oracle for the kernels) against the definition."""

import pytest
import torch

from inference.kernels import add_lora, lora_expand, lora_shrink, lora_torch, make_lora_batch
from tests.kernels.factories import decode_slots, make_weights, naive_add_lora, prefill_slots

SLOTS = 6
USE_PADDING = lora_torch._use_padding  # the real rules, before the fixture replaces them
FULL_STACK = lora_torch._full_stack
RANKS = [16, 8, 4, 0, 16, 8]  # slot 3 is empty


@pytest.fixture(
    autouse=True, params=["per-segment", "padded-gathered", "padded-full-stack", "the rules"]
)
def strategy(request, monkeypatch):
    """Every test runs every strategy: padding never used, or forced on with the active
    slots' weights gathered, or with the whole stack read in place (fp32 only), or chosen by
    the real rules (padded groups of similar segments where the whole batch pads badly)."""
    if request.param == "per-segment":
        monkeypatch.setattr(lora_torch, "_use_padding", lambda batch: False)
        monkeypatch.setattr(lora_torch, "_padding_groups", lambda batch: (batch,))
    elif request.param != "the rules":
        monkeypatch.setattr(lora_torch, "_use_padding", lambda batch: batch.num_segments > 0)
        full = request.param == "padded-full-stack"
        monkeypatch.setattr(
            lora_torch, "_full_stack", lambda batch, w: full and w[0].dtype == torch.float32
        )
    return request.param


def _run(token_slots, in_features, widths, dtype=torch.float32):
    lora_a, lora_b, scales = make_weights(SLOTS, in_features, widths, RANKS, dtype=dtype)
    x = torch.randn(len(token_slots), in_features).to(dtype)
    out = torch.randn(len(token_slots), sum(widths)).to(dtype)
    expected = naive_add_lora(out, x, lora_a, lora_b, scales, token_slots)
    add_lora(out, x, lora_a, lora_b, scales, make_lora_batch(token_slots, backend="torch"))
    return out, expected


@pytest.mark.parametrize(
    "token_slots",
    [
        torch.tensor([2]),
        torch.tensor([-1]),
        torch.tensor([4, -1, 0, 4, 1, -1, 5, 0, 2]),  # unsorted, repeated, mixed with -1
        prefill_slots([20, 1, 13], [1, -1, 5]),
        decode_slots(17, SLOTS),
        torch.full((12,), 0),  # one adapter for the whole batch
        torch.tensor([3, 0, 3, 5, 1, 0]),  # every token has an adapter: no gather or scatter
        prefill_slots([300, 1, 1, 2, 140, 1], [0, 1, -1, 2, 4, 5]),  # pads badly as a whole
    ],
    ids=[
        "one-token",
        "no-adapter",
        "unsorted",
        "prefill",
        "decode",
        "one-adapter",
        "all-active",
        "prefills-among-decodes",
    ],  # fmt: skip
)
@pytest.mark.parametrize("widths", [[40], [48, 16, 16], [24, 24]], ids=["o", "qkv", "gate_up"])
def test_reference_matches_the_per_token_definition(token_slots, widths):
    out, expected = _run(token_slots, 40, widths)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reference_accumulates_half_precision_in_fp32(dtype):
    out, expected = _run(torch.tensor([0, 1, -1, 4, 4, 5, 0]), 96, [32, 16], dtype)
    # Only the final rounding to the storage dtype is allowed: one ulp of the output.
    tol = 8e-3 if dtype == torch.bfloat16 else 1e-3
    torch.testing.assert_close(out.double(), expected.to(dtype).double(), rtol=tol, atol=tol)


def test_expand_without_add_overwrites_only_rows_with_an_adapter():
    token_slots = torch.tensor([1, -1, 0, 1])
    lora_a, lora_b, scales = make_weights(2, 32, [16, 8], [8, 4])
    x = torch.randn(4, 32)
    batch = make_lora_batch(token_slots, backend="torch")
    y = torch.empty(2, 4, 16)
    lora_shrink(x, lora_a, batch, y)
    out = torch.randn(4, 24)
    before = out.clone()
    lora_expand(y, lora_b, scales, batch, out, add=False)
    expected = naive_add_lora(torch.zeros(4, 24), x, lora_a, lora_b, scales, token_slots)
    torch.testing.assert_close(out[[0, 2, 3]].double(), expected[[0, 2, 3]], rtol=1e-5, atol=1e-5)
    assert torch.equal(out[1], before[1])


def test_shrink_writes_each_slice_at_its_rank_padded_to_the_stack():
    token_slots = torch.tensor([0, 1])
    lora_a, _, _ = make_weights(2, 32, [16, 8], [16, 4])
    x = torch.randn(2, 32)
    y = torch.empty(2, 2, 16)
    lora_shrink(x, lora_a, make_lora_batch(token_slots, backend="torch"), y)
    torch.testing.assert_close(y[1, 0], lora_a[1][0] @ x[0])
    torch.testing.assert_close(y[0, 1], lora_a[0][1] @ x[1])
    assert torch.equal(y[:, 1, 4:], torch.zeros(2, 12))  # rank 4 adapter: padding stays zero


def test_the_stack_is_read_in_place_once_a_third_of_the_slots_between_are_active():
    """The slots read in place are those from the batch's lowest to its highest."""
    weights = [torch.zeros(24, 16, 8)]
    assert FULL_STACK(make_lora_batch(torch.tensor([0, 3, 3]), backend="torch"), weights)
    assert FULL_STACK(make_lora_batch(torch.tensor([20, 22, 21, 20]), backend="torch"), weights)
    assert not FULL_STACK(make_lora_batch(torch.tensor([0, 23]), backend="torch"), weights)
    half = [w.half() for w in weights]  # an upcast would copy the whole stack
    assert not FULL_STACK(make_lora_batch(torch.tensor([0, 1, 2]), backend="torch"), half)
    long_prefill = prefill_slots([100, 100], [0, 5])  # 6 slots x 100 rows for 200 real ones
    assert not FULL_STACK(make_lora_batch(long_prefill, backend="torch"), weights)


def test_padding_is_chosen_for_several_adapters_but_not_for_a_prefill_among_decodes():
    def padded(token_slots):
        return USE_PADDING(make_lora_batch(token_slots, backend="torch"))

    assert padded(torch.arange(8) % 4)  # decode: 4 adapters, 2 tokens each
    assert padded(torch.arange(256) % 8)  # even segments waste nothing
    assert not padded(torch.zeros(16, dtype=torch.int64))  # one adapter: one plain matmul
    assert not padded(prefill_slots([200, 1, 1, 1], [0, 1, 2, 3]))  # 800 rows for 203


@pytest.mark.parametrize("token_slots", [torch.tensor([3, 0, 3, 5, 1, 0]), decode_slots(9, SLOTS)])
def test_add_lora_writes_big_deltas_one_slice_at_a_time(token_slots, monkeypatch):
    monkeypatch.setattr(lora_torch, "CAT_MAX_ELEMENTS", 0)  # as a prefill's deltas would be
    out, expected = _run(token_slots, 40, [48, 16, 16])
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
