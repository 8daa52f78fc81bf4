"""add_lora's guarantees to the engine, on both backends, and the errors a caller can cause."""

import pytest
import torch

from inference.kernels import add_lora, lora_expand, lora_shrink, make_lora_batch
from tests.kernels.factories import make_weights

BACKENDS = ["torch", "triton"]


def _inputs(
    token_slots, ranks=(16, 8, 0), widths=(32, 16, 16), in_features=32, dtype=torch.float32
):
    lora_a, lora_b, scales = make_weights(
        len(ranks), in_features, list(widths), list(ranks), dtype=dtype
    )
    x = torch.randn(len(token_slots), in_features).to(dtype)
    out = torch.randn(len(token_slots), sum(widths)).to(dtype)
    return out, x, lora_a, lora_b, scales


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rows_without_an_adapter_stay_bit_identical(backend, dtype):
    token_slots = torch.tensor([-1, 0, -1, 1, 1, -1])
    out, x, lora_a, lora_b, scales = _inputs(token_slots, dtype=dtype)
    before = out.clone()
    add_lora(out, x, lora_a, lora_b, scales, make_lora_batch(token_slots, backend=backend))
    idle = token_slots < 0
    assert torch.equal(out[idle], before[idle])
    assert not torch.equal(out[~idle], before[~idle])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_slot_with_scale_zero_changes_nothing(backend):
    token_slots = torch.tensor([0, 1, 0])
    out, x, lora_a, lora_b, scales = _inputs(token_slots, ranks=(16, 8))
    scales.zero_()
    before = out.clone()
    add_lora(out, x, lora_a, lora_b, scales, make_lora_batch(token_slots, backend=backend))
    assert torch.equal(out, before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_without_adapters_is_a_no_op(backend):
    token_slots = torch.tensor([-1, -1])
    out, x, lora_a, lora_b, scales = _inputs(token_slots)
    before = out.clone()
    add_lora(out, x, lora_a, lora_b, scales, make_lora_batch(token_slots, backend=backend))
    assert torch.equal(out, before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reused_buffer_gives_the_same_result(backend):
    token_slots = torch.tensor([1, 0, -1])
    out, x, lora_a, lora_b, scales = _inputs(token_slots)
    batch = make_lora_batch(token_slots, backend=backend)
    fresh = out.clone()
    add_lora(fresh, x, lora_a, lora_b, scales, batch)
    buffer = torch.full((4, 10, 16), float("nan"))  # larger than needed, dirty
    add_lora(out, x, lora_a, lora_b, scales, batch, buffer=buffer)
    torch.testing.assert_close(out, fresh, rtol=1e-6, atol=1e-6)


def _bad(name):
    """Inputs for a 3-token batch over 3 slots, with one thing broken."""
    token_slots = torch.tensor([0, 2, -1])
    out, x, lora_a, lora_b, scales = _inputs(token_slots)
    args = dict(out=out, x=x, lora_a=lora_a, lora_b=lora_b, scales=scales)
    if name == "x has the wrong width":
        args["x"] = torch.randn(3, 40)
    elif name == "x has the wrong token count":
        args["x"] = torch.randn(4, 32)
    elif name == "out is narrower than the slices":
        args["out"] = torch.randn(3, 60)
    elif name == "B rank above the stacked A rank":
        args["lora_b"] = [torch.zeros(3, w, 32) for w in (32, 16, 16)]
    elif name == "slices disagree on rank":
        args["lora_a"] = [lora_a[0], lora_a[1][:, :8], lora_a[2]]
    elif name == "A and B disagree on slot count":
        token_slots = torch.tensor([0, 1, -1])
        args["lora_b"] = [b[:2] for b in lora_b]
        args["scales"] = scales[:2]
    elif name == "one A per B":
        args["lora_a"] = lora_a[:2]
    elif name == "scales per slot":
        args["scales"] = torch.ones(5)
    elif name == "dtype mismatch":
        args["x"] = x.half()
    elif name == "integer activations":
        args["x"] = torch.ones(3, 32, dtype=torch.int32)
    elif name == "weights not a list":
        args["lora_a"] = lora_a[0]
    elif name == "slot beyond the stack":
        token_slots = torch.tensor([0, 3, -1])
    return token_slots, args


BAD = {
    "x has the wrong width": "input features",
    "x has the wrong token count": "tokens",
    "out is narrower than the slices": "sum of slice widths",
    "B rank above the stacked A rank": "rank",
    "slices disagree on rank": "rank",
    "A and B disagree on slot count": "lora_a holds 3 slots but lora_b holds 2",
    "one A per B": "slices",
    "scales per slot": "scales",
    "dtype mismatch": "dtype",
    "integer activations": "dtype",
    "weights not a list": "list",
    "slot beyond the stack": "token slot 3 is out of range",
}


@pytest.mark.parametrize("name", BAD)
def test_bad_inputs_raise_a_value_error_that_names_the_problem(name):
    token_slots, args = _bad(name)
    batch = make_lora_batch(token_slots, backend="torch")
    with pytest.raises(ValueError, match=BAD[name]):
        add_lora(args["out"], args["x"], args["lora_a"], args["lora_b"], args["scales"], batch)


def test_bad_inputs_are_refused_even_when_no_token_has_an_adapter():
    token_slots, args = _bad("x has the wrong width")
    batch = make_lora_batch(torch.full((3,), -1), backend="torch")
    with pytest.raises(ValueError, match="input features"):
        add_lora(args["out"], args["x"], args["lora_a"], args["lora_b"], args["scales"], batch)


def test_shrink_refuses_a_buffer_whose_rank_exceeds_the_stack():
    token_slots = torch.tensor([0, 1])
    _, x, lora_a, _, _ = _inputs(token_slots)
    with pytest.raises(ValueError, match="differs from the stacked rank 16"):
        lora_shrink(x, lora_a, make_lora_batch(token_slots, backend="torch"), torch.empty(3, 2, 32))


def test_expand_refuses_y_with_the_wrong_slice_count():
    token_slots = torch.tensor([0, 1])
    out, _, _, lora_b, scales = _inputs(token_slots)
    with pytest.raises(ValueError, match=r"y must be \[n_slices, num_tokens, rank\]"):
        lora_expand(
            torch.empty(2, 2, 16),
            lora_b,
            scales,
            make_lora_batch(token_slots, backend="torch"),
            out,
        )


@pytest.mark.parametrize(
    "buffer",
    [
        torch.empty(3, 1, 16),
        torch.empty(3, 3, 8),
        torch.empty(3, 3, 16, dtype=torch.float16),
        "scratch",
    ],
    ids=["too-few-tokens", "wrong-rank", "not-fp32", "not-a-tensor"],
)
def test_add_lora_refuses_an_unfit_buffer(buffer):
    token_slots = torch.tensor([0, 1, 2])
    out, x, lora_a, lora_b, scales = _inputs(token_slots)
    batch = make_lora_batch(token_slots, backend="torch")
    with pytest.raises(ValueError, match="buffer must be fp32 scratch"):
        add_lora(out, x, lora_a, lora_b, scales, batch, buffer=buffer)


def test_tensors_on_another_device_than_the_batch_are_refused():
    token_slots = torch.tensor([0, 1])
    out, x, lora_a, lora_b, scales = _inputs(token_slots)
    batch = make_lora_batch(token_slots, device="meta", backend="torch")
    with pytest.raises(ValueError, match="x is on cpu but the LoRA batch is on meta"):
        add_lora(out, x, lora_a, lora_b, scales, batch)
