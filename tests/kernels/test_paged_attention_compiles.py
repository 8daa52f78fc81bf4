"""The paged attention kernels compile for real GPUs, checked on a host without one.

As for the LoRA kernels (test_lora_triton_compiles.py): the interpreter runs code a GPU
compiler rejects, so each kernel is compiled ahead of time, through ptxas, for Hopper
(H100/H200) and Ampere (A100), with the tiles paged_attention.py chooses for the head
sizes models use, and must fit the shared memory of those GPUs. It runs in a child
process, where TRITON_INTERPRET (set for the other kernel tests) is unset.
"""

import os

from tests.fresh_python import run_python

SCRIPT = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from inference.kernels import paged_attention as P
from inference.kernels import paged_attention_kernels as K

INDEX = ("block_tables_ptr", "context_lens_ptr", "cu_seqlens_ptr", "context_starts_ptr")
SHARED_BYTES = {90: 232448, 80: 166912}  # the most one block may use (opt-in)


def build(fn, dtype, arch, **constexprs):
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in INDEX:
            signature[name] = "*i32"
        elif name.startswith("part_"):
            signature[name] = "*fp32"
        elif name.endswith("_ptr"):
            signature[name] = f"*{dtype}"
        else:
            signature[name] = "fp32" if name in ("scale", "softcap") else "i32"
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32))
    assert kernel.asm.get("cubin"), fn.__name__
    assert kernel.metadata.shared <= SHARED_BYTES[arch], (fn.__name__, kernel.metadata.shared)


# (dtype, head_dim, query heads per KV head, splits, sliding window, soft-capping)
CONFIGS = [
    ("bf16", 128, 4, 8, False, False),  # Llama 3 8B
    ("bf16", 256, 2, 1, True, True),  # Gemma 2
    ("fp16", 80, 1, 3, True, False),  # Phi-3-like head size, no GQA
    ("fp32", 128, 8, 2, False, False),
]
for arch in (90, 80):
    for dtype, head_dim, group, splits, sliding, softcap in CONFIGS:
        block_d = P._pow2(head_dim)
        common = dict(
            HEAD_DIM=head_dim, GROUP=group, BLOCK_SIZE=16, BLOCK_N=P._block_n(block_d),
            BLOCK_D=block_d, SLIDING=sliding, SOFTCAP=softcap,
            PRECISION="ieee" if dtype == "fp32" else "tf32",
        )
        build(K.paged_decode_kernel, dtype, arch, NUM_SPLITS=splits, BLOCK_H=P._pow2(group),
              **common)
        build(K.paged_decode_reduce_kernel, dtype, arch, HEAD_DIM=head_dim, NUM_SPLITS=splits,
              BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d)
        block_m = max(P.EXTEND_BLOCK_M, P._pow2(group))
        build(K.paged_extend_kernel, dtype, arch, BLOCK_M=block_m, BLOCK_Q=block_m // group,
              **common | {"BLOCK_SIZE": 32})
print("compiled")
"""


def test_every_paged_attention_kernel_compiles_for_hopper_and_ampere():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = run_python(SCRIPT, env=env | {"TRITON_DEFAULT_FP_FUSION": "1"})
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]
