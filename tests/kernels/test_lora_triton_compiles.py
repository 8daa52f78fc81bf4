"""The kernels compile for real GPUs, checked on a host without one.

The interpreter runs code a GPU compiler rejects (bad layouts, pointer or control-flow
misuse, tile shapes), so each kernel is also compiled ahead of time, through ptxas, for
Hopper (H100/H200) and Ampere (A100). It uses the local Triton; a GPU box with an older one
may still be stricter (Triton 3.9 accepts dot tiles of 8 that older versions refuse, which
is why the kernels keep every tile at 16 or more). This runs in a child process:
TRITON_INTERPRET, set for the other kernel tests, would turn the kernels into interpreted
functions that cannot be compiled.
"""

import os

from tests.fresh_python import run_python

SCRIPT = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from inference.kernels import triton_kernels as K

POINTERS = {"a_table_ptr": "*i64", "b_table_ptr": "*i64", "y_ptr": "*fp32", "scales_ptr": "*fp32"}


def build(fn, dtype, arch, **constexprs):
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = POINTERS.get(name, f"*{dtype}" if name[0] in "xabo" else "*i64")
        else:
            signature[name] = "i64" if name.startswith("stride") else "i32"
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32))
    assert kernel.asm.get("cubin"), fn.__name__


for arch in (90, 80):
    for dtype, precision in (("bf16", "tf32"), ("fp32", "ieee")):
        build(K.sgmv_shrink_kernel, dtype, arch, N_SLICES=3, BLOCK_M=64, BLOCK_R=16,
              BLOCK_K=64, SPLIT_K=4, PRECISION=precision)
        build(K.sgmv_expand_kernel, dtype, arch, N_SLICES=2, BLOCK_M=16, BLOCK_N=64,
              BLOCK_R=16, ADD=True, PRECISION=precision)
    build(K.bgmv_shrink_kernel, "fp16", arch, BLOCK_R=16, BLOCK_K=128, SPLIT_K=1)
    build(K.bgmv_expand_kernel, "fp16", arch, BLOCK_N=64, BLOCK_R=16, ADD=False)
print("compiled")
"""


def test_every_kernel_compiles_for_hopper_and_ampere():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = run_python(SCRIPT, env=env | {"TRITON_DEFAULT_FP_FUSION": "1"})
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]
