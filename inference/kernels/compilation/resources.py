"""What a compiled variant costs on the device: shared memory (Triton's metadata), and the
registers and spills ptxas reports for its PTX (the ptxas Triton itself uses for the target,
run again with -v, without the extra flags Triton 3.9 adds, which change no count here;
its answers are cached beside Triton's own cache, by the kernel's hash)."""

import json
import os
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from triton import knobs
from triton.backends.nvidia.compiler import get_ptxas

from .target import SHARED_MEMORY_LIMIT

SPILL_LIMIT = 256  # bytes per thread, bf16 / fp16 kernels
FP32_SPILL_LIMIT = 2048  # fp32 (IEEE dots) kernels are the exact path, not the fast one


@dataclass(frozen=True)
class Resources:
    shared: int  # bytes of shared memory per block
    registers: int  # per thread
    spill_stores: int  # bytes per thread
    spill_loads: int

    @property
    def spills(self) -> int:
        return max(self.spill_stores, self.spill_loads)


def _cache_dir() -> Path:
    return Path(knobs.cache.dir) / "loraplex-resources"


def _ptxas_usage(ptx: str, arch: int) -> tuple[int, int, int]:
    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "kernel.ptx")
        src.write_text(ptx)
        done = subprocess.run(
            [get_ptxas(arch).path, "-v", f"--gpu-name={gpu}", str(src), "-o", f"{src}.o"],
            capture_output=True,
            text=True,
            check=True,
        )
    log = done.stderr
    registers = int(re.search(r"Used (\d+) registers", log).group(1))  # type: ignore[union-attr]
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    stores, loads = (int(spills.group(1)), int(spills.group(2))) if spills else (0, 0)
    return registers, stores, loads


def resources(kernel: Any, arch: int) -> Resources:
    """The resources of a CompiledKernel built for sm_<arch>."""
    path = _cache_dir() / f"{kernel.hash}-sm{arch}.json"
    try:
        return Resources(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass
    registers, stores, loads = _ptxas_usage(kernel.asm["ptx"], arch)
    found = Resources(kernel.metadata.shared, registers, stores, loads)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(found)))
    tmp.replace(path)
    return found


def problems(found: Resources, arch: int, dtype: str) -> list[str]:
    """Why a variant could not launch on sm_<arch>, or would run far from its speed."""
    out = []
    limit = SHARED_MEMORY_LIMIT[arch]
    if found.shared > limit:
        out.append(f"needs {found.shared} B of shared memory, sm_{arch} allows {limit}")
    spill_limit = FP32_SPILL_LIMIT if dtype == "float32" else SPILL_LIMIT
    if found.spills > spill_limit:
        out.append(f"spills {found.spills} B per thread (limit {spill_limit} for {dtype})")
    return out
