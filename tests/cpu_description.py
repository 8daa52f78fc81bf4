"""The CPU a numeric test ran on, in one line for its report and its failure messages.

fp32 results differ in their last bits with the kernels torch picks for an instruction set
(ATen's vectorized softmax and reductions at AVX2 or AVX-512; oneDNN's bf16 and AMX paths
where they are allowed), so a parity failure seen on one machine only is read against this.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import torch

# the flags that change which kernels torch runs, or how precisely
FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
         "amx_bf16", "amx_int8")  # fmt: skip
CPUINFO = Path("/proc/cpuinfo")


def _cpuinfo() -> tuple[str, set[str]]:
    """(model name, flags) of the first processor listed; empty where there is no cpuinfo."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return platform.processor() or platform.machine(), set()
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields.get("model name", platform.machine()), set(fields.get("flags", "").split())


@functools.cache
def cpu_description() -> str:
    name, flags = _cpuinfo()
    present = [f for f in FLAGS if f in flags] or ["none of " + "/".join(FLAGS)]
    mkldnn = torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
    return (
        f"{name}; flags {' '.join(present)}; torch {torch.__version__} cpu capability "
        f"{torch.backends.cpu.get_cpu_capability()}, float32 matmul precision "
        f"{torch.get_float32_matmul_precision()}, mkldnn {'on' if mkldnn else 'off'}, "
        f"{torch.get_num_threads()} threads"
    )
