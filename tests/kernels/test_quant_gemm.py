"""The quantized-weight GEMMs: the torch references against a dequantize-then-matmul built
here from the formats' definitions, the packing against compressed-tensors' own (when it
is installed), and the Triton kernels against the references under Triton's interpreter
(conftest.py sets it), in fp32: the interpreter's bf16 maths is wrong.

The interpreter runs the FP8 kernels too (e4m3 loads, casts and dots), so the FP8 path's
maths is checked here; what only the GPU compiler checks (fp8 tensor-core dots on sm_90,
shared memory, spills) is the compile check's (inference/kernels/compilation, --quant).
"""

import importlib.util

import pytest
import torch

from inference.kernels import Fp8Weights, PackedIntWeights, quant_linear
from inference.kernels import quant_ref as ref
from inference.kernels import quant_triton as tri

FP8 = torch.float8_e4m3fn
HAS_COMPRESSED_TENSORS = importlib.util.find_spec("compressed_tensors") is not None


def pack_int32(stored: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned `bits`-bit values [rows, cols] packed along cols into int32, lowest bits
    first, the last word zero-padded: the pack-quantized layout, written out plainly."""
    per_word = 32 // bits
    rows, cols = stored.shape
    words = torch.zeros(rows, -(-cols // per_word), dtype=torch.int64)
    for col in range(cols):
        words[:, col // per_word] |= stored[:, col].long() << ((col % per_word) * bits)
    words = torch.where(words >= 2**31, words - 2**32, words)  # the same 32 bits, signed
    return words.to(torch.int32)


def quantized_layer(bits, out_features, in_features, group_size, symmetric, actorder):
    """Signed integer weights, scales, zero points and a column-to-group map, and the layer
    in the checkpoint's tensors: (q, scale, zero, groups_of_columns, PackedIntWeights)."""
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    offset = 2 ** (bits - 1)
    group_size = group_size or in_features
    groups = in_features // group_size
    q = torch.randint(low, high + 1, (out_features, in_features))
    scale = torch.rand(out_features, groups) * 0.02 + 0.001
    zero = torch.randint(low, high + 1, (out_features, groups)) if not symmetric else None
    if actorder:
        column_groups = torch.randperm(in_features) // group_size
    else:
        column_groups = torch.arange(in_features) // group_size
    weights = PackedIntWeights(
        weight_packed=pack_int32(q + offset, bits),
        weight_scale=scale,
        bits=bits,
        weight_zero_point=None if zero is None else pack_int32((zero + offset).t(), bits).t(),
        g_idx=column_groups.to(torch.int32) if actorder else None,
    )
    return q, scale, zero, column_groups, weights


def dequantized(q, scale, zero, column_groups):
    """w = (q - zero) * scale, each column with its group's scale and zero point."""
    shifted = q.double() - (0 if zero is None else zero.double()[:, column_groups])
    return shifted * scale.double()[:, column_groups]


def assert_gemm_close(got, expected):
    """Equal but for the order of fp32 sums: to a millionth of the largest output."""
    atol = 1e-6 * float(expected.abs().max()) + 1e-7
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=atol)


def int_gemm(impl, x, w: PackedIntWeights, **kwargs):
    return impl.int_weight_gemm(
        x, w.weight_packed, w.weight_scale, w.bits, w.weight_zero_point, w.g_idx, **kwargs
    )


GROUPS = [32, 64, 128, None]  # None: per channel


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", GROUPS)
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("actorder", [False, True])
def test_int_reference_is_the_dequantized_matmul(bits, group_size, symmetric, actorder):
    q, scale, zero, columns, w = quantized_layer(bits, 24, 256, group_size, symmetric, actorder)
    x = torch.randn(5, 256)
    expected = x.double() @ dequantized(q, scale, zero, columns).t()
    torch.testing.assert_close(int_gemm(ref, x, w).double(), expected, rtol=1e-5, atol=1e-5)


def test_int_reference_dequantizes_a_block_of_rows_at_a_time(monkeypatch):
    _, _, _, _, w = quantized_layer(4, 37, 128, 32, False, False)
    x = torch.randn(3, 128)
    whole = int_gemm(ref, x, w)
    monkeypatch.setattr(ref, "DEQUANT_BLOCK_ELEMENTS", 5 * 128)  # 5 rows per block
    # the same products; the CPU's BLAS may order a narrower matmul's sums otherwise (an ulp)
    torch.testing.assert_close(int_gemm(ref, x, w), whole, rtol=2e-6, atol=2e-6)


def test_dequantize_in_the_scale_dtype_as_compressed_tensors_does():
    q, scale, zero, columns, w = quantized_layer(4, 16, 64, 32, False, False)
    w16 = PackedIntWeights(w.weight_packed, scale.to(torch.bfloat16), 4, w.weight_zero_point)
    got = ref.dequantize_packed(w16.weight_packed, w16.weight_scale, 4, 64, w16.weight_zero_point)
    assert got.dtype == torch.bfloat16
    shifted = (q - zero[:, columns]).to(torch.bfloat16)
    torch.testing.assert_close(got, shifted * scale.to(torch.bfloat16)[:, columns], rtol=0, atol=0)


def test_references_answer_in_the_activations_dtype():
    *_, w = quantized_layer(4, 16, 64, 32, True, False)
    weight, ws = fp8_layer(16, 64, per_channel=True)
    x = torch.randn(3, 64)
    x16 = x.to(torch.bfloat16)
    close = {"rtol": 2e-2, "atol": 2e-2}
    int_y = int_gemm(ref, x16, w)
    assert int_y.dtype == torch.bfloat16
    torch.testing.assert_close(int_y.float(), int_gemm(ref, x, w), **close)
    fp8_y = ref.fp8_weight_only_gemm(x16, weight, ws)
    assert fp8_y.dtype == torch.bfloat16
    torch.testing.assert_close(fp8_y.float(), ref.fp8_weight_only_gemm(x, weight, ws), **close)


@pytest.mark.skipif(not HAS_COMPRESSED_TENSORS, reason="compressed-tensors is not installed")
@pytest.mark.parametrize("bits", [4, 8])
def test_packing_is_compressed_tensors_own(bits):
    from compressed_tensors.compressors.pack_quantized.helpers import (  # type: ignore[import-untyped]
        pack_to_int32,
        unpack_from_int32,
    )

    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    q = torch.randint(low, high + 1, (37, 64), dtype=torch.int8)
    offset = 2 ** (bits - 1)
    # weights along the input dimension, zero points along the output dimension
    assert torch.equal(pack_to_int32(q, bits), pack_int32(q.int() + offset, bits))
    packed_rows = pack_to_int32(q, bits, packed_dim=0)
    assert torch.equal(packed_rows, pack_int32((q.int() + offset).t(), bits).t())
    assert torch.equal(ref.unpack_int32(pack_to_int32(q, bits), bits, 64) - offset, q.int())
    unpacked = ref.unpack_int32(packed_rows, bits, 37, dim=0)
    assert torch.equal(unpacked - offset, unpack_from_int32(packed_rows, bits, q.shape, 0).int())


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", GROUPS)
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("actorder", [False, True])
@pytest.mark.parametrize("tokens", [1, 33])
def test_int_triton_equals_the_reference(bits, group_size, symmetric, actorder, tokens):
    *_, w = quantized_layer(bits, 37, 256, group_size, symmetric, actorder)
    x = torch.randn(tokens, 256)
    expected = int_gemm(ref, x, w)
    assert_gemm_close(int_gemm(tri, x, w), expected)


def test_int_triton_scales_each_element_when_a_tile_spans_groups():
    # a group of 24 columns is no power of two: K tiles cross groups
    *_, w = quantized_layer(4, 20, 96, 24, False, False)
    x = torch.randn(3, 96)
    assert_gemm_close(int_gemm(tri, x, w), int_gemm(ref, x, w))


def test_int_triton_writes_into_a_strided_out():
    *_, w = quantized_layer(8, 16, 64, 32, True, False)
    x = torch.randn(4, 128)[:, ::2]
    out = torch.zeros(4, 40)
    int_gemm(tri, x, w, out=out[:, 8:24])
    assert_gemm_close(out[:, 8:24], int_gemm(ref, x, w))
    assert not out[:, :8].any() and not out[:, 24:].any()


def test_int_triton_reads_packed_tensors_stored_output_major():
    *_, w = quantized_layer(4, 48, 256, 64, False, True)
    moved = w.output_major()
    assert moved.weight_packed.stride() == (1, 48) and moved.weight_scale.stride() == (1, 48)
    assert torch.equal(moved.weight_packed, w.weight_packed)
    x = torch.randn(5, 256)
    assert_gemm_close(int_gemm(tri, x, moved), int_gemm(ref, x, w))
    assert_gemm_close(quant_linear(x, moved), int_gemm(ref, x, w))


def test_packed_tensors_that_do_not_fit_are_refused():
    *_, w = quantized_layer(4, 16, 64, 32, False, False)
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="weight_scale"):
        ref.int_weight_gemm(x, w.weight_packed, w.weight_scale[:, :1].expand(16, 3), 4)
    with pytest.raises(ValueError, match="weight_zero_point"):
        ref.int_weight_gemm(x, w.weight_packed, w.weight_scale, 4, w.weight_zero_point[:1])
    with pytest.raises(ValueError, match="3-bit"):
        ref.int_weight_gemm(x, w.weight_packed, w.weight_scale, 3)
    with pytest.raises(ValueError, match="weight_packed"):
        ref.int_weight_gemm(torch.randn(2, 72), w.weight_packed, w.weight_scale, 4)


def fp8_layer(out_features, in_features, per_channel):
    weight = (torch.randn(out_features, in_features) * 2).to(FP8)
    if per_channel:
        return weight, torch.rand(out_features, 1) * 0.01 + 0.001
    return weight, torch.tensor(0.004)


def test_fp8_reference_quantizes_each_token_and_multiplies_the_scales():
    weight, ws = fp8_layer(24, 128, per_channel=True)
    x = torch.randn(5, 128) * torch.tensor([0.01, 1.0, 30.0, 0.5, 2.0])[:, None]
    xs = x.abs().amax(dim=1, keepdim=True) / 448
    xq = (x / xs).to(FP8)
    expected = (xq.double() * xs.double()) @ (weight.double() * ws.double()).t()
    close = {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(ref.fp8_gemm(x, weight, ws).double(), expected, **close)
    static = torch.tensor(0.05)
    xq = (x / static).clamp(-448, 448).to(FP8)
    expected = (xq.double() * 0.05) @ (weight.double() * ws.double()).t()
    torch.testing.assert_close(ref.fp8_gemm(x, weight, ws, static).double(), expected, **close)
    expected = x.double() @ (weight.double() * ws.double()).t()
    torch.testing.assert_close(ref.fp8_weight_only_gemm(x, weight, ws).double(), expected, **close)


def test_fp8_quantize_kernel_rounds_as_torch_casts():
    """Every e4m3 value, the midpoints between neighbours (ties to even) and the floats
    either side of them, and values past the range (saturated)."""
    values = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    values = values[~values.isnan()].sort().values
    middles = (values[1:] + values[:-1]) / 2
    above, below = torch.tensor(1e9), torch.tensor(-1e9)
    x = torch.cat([values, middles, middles.nextafter(above), middles.nextafter(below),
                   torch.tensor([500.0, -1e6])])  # fmt: skip
    xq, xs = tri.quantize_fp8_rows(x[None, :], torch.tensor(1.0))
    assert torch.equal(xs, torch.ones(1, 1))
    assert torch.equal(xq.float(), x.clamp(-448, 448).to(FP8).float()[None, :])
    xq, xs = tri.quantize_fp8_rows(torch.zeros(2, 16))  # an all-zero row keeps a scale
    assert torch.all(xs > 0) and not xq.float().any()


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("tokens", [1, 33])
def test_fp8_triton_equals_the_reference(per_channel, static, tokens):
    weight, ws = fp8_layer(40, 256, per_channel)
    x = torch.randn(tokens, 256)
    input_scale = torch.tensor(0.01) if static else None
    xq, xs = tri.quantize_fp8_rows(x, input_scale)
    xq_ref, xs_ref = ref.quantize_fp8_rows(x, input_scale)
    assert torch.equal(xq.float(), xq_ref.float()) and torch.equal(xs, xs_ref)
    expected = ref.fp8_gemm(x, weight, ws, input_scale)
    got = tri.fp8_gemm(x, weight, ws, input_scale)
    assert_gemm_close(got, expected)


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("tokens", [1, 33])
def test_fp8_weight_only_triton_equals_the_reference(per_channel, tokens):
    weight, ws = fp8_layer(40, 256, per_channel)
    x = torch.randn(tokens, 256)
    expected = ref.fp8_weight_only_gemm(x, weight, ws)
    got = tri.fp8_weight_only_gemm(x, weight, ws)
    assert_gemm_close(got, expected)


def test_fp8_weight_only_kernel_decodes_every_e4m3_byte():
    codes = torch.arange(256, dtype=torch.uint8).view(FP8)
    finite = codes[~codes.float().isnan()]
    weight = finite.reshape(-1, 2)  # 127 outputs of 2 inputs
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    got = tri.fp8_weight_only_gemm(x, weight, torch.tensor(1.0))
    assert torch.equal(got, weight.float().t())


def test_quant_linear_runs_each_layer_kind_on_the_chosen_backend():
    *_, packed = quantized_layer(4, 24, 128, 32, False, False)
    weight, ws = fp8_layer(24, 128, per_channel=True)
    x = torch.randn(2, 3, 128)
    expected = int_gemm(ref, x.reshape(6, 128), packed).reshape(2, 3, 24)
    torch.testing.assert_close(quant_linear(x, packed), expected, rtol=0, atol=0)
    assert_gemm_close(quant_linear(x, packed, backend="triton"), expected)
    fp8 = Fp8Weights(weight, ws)
    expected = ref.fp8_gemm(x.reshape(6, 128), weight, ws).reshape(2, 3, 24)
    torch.testing.assert_close(quant_linear(x, fp8), expected, rtol=0, atol=0)
    assert_gemm_close(quant_linear(x, fp8, backend="triton"), expected)
    weight_only = Fp8Weights(weight, ws, quantize_activations=False)
    expected = ref.fp8_weight_only_gemm(x.reshape(6, 128), weight, ws).reshape(2, 3, 24)
    torch.testing.assert_close(quant_linear(x, weight_only), expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="takes 128"):
        quant_linear(torch.randn(2, 64), packed)


def test_the_compile_check_meets_the_quantized_launches_only_when_asked():
    import dataclasses

    from inference.kernels.compilation.compile import listed_keys
    from inference.kernels.compilation.shapes import EngineShapes
    from inference.kernels.compilation.variants import DEFAULT_QUANT_SCHEMES
    from inference.kernels.lora_tiles import DEFAULT_TABLE

    shapes = EngineShapes(
        name="tiny", dtype=torch.bfloat16, hidden=256, intermediate=512, num_heads=4,
        num_kv_heads=2, head_dim=64, windows=(None,), softcap=None, max_model_len=256,
        max_num_seqs=8, max_num_batched_tokens=128, lora_rank=8,
    )  # fmt: skip
    plain = listed_keys([shapes], DEFAULT_TABLE)
    quantized = dataclasses.replace(shapes, quant_schemes=DEFAULT_QUANT_SCHEMES)
    keys = listed_keys([quantized], DEFAULT_TABLE)
    quant = {k for k in keys if k not in plain}
    assert plain <= keys
    assert {k.kernel for k in quant} == {
        "int_weight_gemm_kernel", "fp8_quantize_rows_kernel", "fp8_gemm_kernel",
    }  # fmt: skip
    # one variant per token bucket of each GEMM, for 4- and 8-bit
    assert sum(k.kernel == "int_weight_gemm_kernel" for k in quant) == 2 * len(tri.INT_TILES)
    assert sum(k.kernel == "fp8_gemm_kernel" for k in quant) == len(tri.FP8_TILES)
