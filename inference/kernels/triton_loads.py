# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
# mypy: disallow-untyped-decorators=False
"""The tile load every Triton kernel here shares: a masked 2-D tile read in the storage dtype
and upcast to fp32, the precision the kernels compute in (bf16 maths is also wrong in
Triton's interpreter). The arguments are Triton values, so the type checker asks for no
annotations here (the comments on lines 1-2).
"""

import triton
import triton.language as tl


@triton.jit
def load_tile(ptr, rows, cols, stride_row, stride_col, mask_row, mask_col):
    """[len(rows), len(cols)] in fp32 from `ptr`; masked-out elements are 0. A load that
    adds its address terms in the other order stays written out: that order changes the
    compiled kernel."""
    return tl.load(
        ptr + rows[:, None] * stride_row + cols[None, :] * stride_col,
        mask=mask_row[:, None] & mask_col[None, :], other=0.0,
    ).to(tl.float32)  # fmt: skip
