"""Every tiling in the default tile table compiles for Hopper (sm_90, bf16) and fits its
shared memory, checked on a host without a GPU: the interpreter accepts tiles, warp counts
and pipeline depths that the compiler or the device would refuse. In a child process, as
TRITON_INTERPRET (set for the other kernel tests) would make the kernels uncompilable.
"""

import os

from tests.fresh_python import run_python

SCRIPT = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from inference.kernels import triton_kernels as K
from inference.kernels.lora_tiles import DEFAULT_TABLE

POINTERS = {"a_table_ptr": "*i64", "b_table_ptr": "*i64", "y_ptr": "*fp32", "scales_ptr": "*fp32"}
SHARED_MEMORY = 232448  # Hopper: 227 KB per block


def build(fn, options, **constexprs):
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = POINTERS.get(name, "*bf16" if name[0] in "xabo" else "*i64")
        else:
            signature[name] = "i64" if name.startswith("stride") else "i32"
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(options))
    assert kernel.asm.get("cubin"), (fn.__name__, constexprs)
    assert kernel.metadata.shared <= SHARED_MEMORY, (fn.__name__, constexprs, options)


launches = set()
for (op, path, rank, _, _), t in DEFAULT_TABLE.entries.items():
    r = max(16, triton.next_power_of_2(rank))
    split = min(t.split_k, 2)  # the kernel's code differs only between 1 and more
    if (op, path) == ("shrink", "sgmv"):
        constexprs = (("BLOCK_M", t.block_m), ("BLOCK_K", t.block_k), ("SPLIT_K", split),
                      ("N_SLICES", 3), ("PRECISION", "tf32"))
    elif (op, path) == ("shrink", "bgmv"):
        constexprs = (("BLOCK_K", t.block_k), ("SPLIT_K", split))
    elif (op, path) == ("expand", "sgmv"):
        constexprs = (("BLOCK_M", t.block_m), ("BLOCK_N", t.block_n), ("N_SLICES", 2),
                      ("ADD", True), ("PRECISION", "tf32"))
    else:
        constexprs = (("BLOCK_N", t.block_n), ("ADD", True))
    options = (("num_warps", t.num_warps), ("num_stages", t.num_stages))
    launches.add((f"{path}_{op}_kernel", (("BLOCK_R", r),) + constexprs, options))
for name, constexprs, options in sorted(launches):
    build(getattr(K, name), options, **dict(constexprs))
print("compiled", len(launches))
"""


def test_every_default_tiling_compiles_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = run_python(SCRIPT, env=env | {"TRITON_DEFAULT_FP_FUSION": "1"})
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]
