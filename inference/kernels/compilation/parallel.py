"""Compiling in several processes: Triton's compiler holds the GIL for most of its work, so
threads barely overlap. Each process runs the same enumeration and compiles its shard of
the new keys (compile.py) for one target into Triton's on-disk cache, which any later
process compiling the same variant for the same target loads instead."""

import os
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import torch

from inference.kernels.lora_tiles import TileTable

from .resources import Resources
from .shapes import EngineShapes

Known = Mapping[str, Resources] | None  # a record's variants (records.py)


def compile_shard(arch: int, shapes: list[EngineShapes], table: TileTable,
                  table_dtypes: list[torch.dtype], shard: tuple[int, int],
                  report: bool = True, known: Known = None) -> list[dict[str, Any]]:  # fmt: skip
    """Compile one shard for sm_<arch> with no GPU; its rows of the compile table (report.py),
    or only those of the variants that failed when not `report`."""
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # 3.9 warns when it is unset
    from .compile import compile_all
    from .report import failures, rows
    from .target import compile_target

    with compile_target(arch):
        compilation = compile_all(shapes, table, shard, table_dtypes, arch, known)
    return rows(compilation, arch) if report else failures(compilation)


def compile_sharded(arch: int, shapes: list[EngineShapes], table: TileTable,
                    table_dtypes: list[torch.dtype], jobs: int, report: bool = True,
                    known: Known = None) -> list[dict[str, Any]]:  # fmt: skip
    """`compile_shard` over `jobs` processes (spawned: none inherits a CUDA context)."""
    if jobs <= 1:
        return compile_shard(arch, shapes, table, table_dtypes, (0, 1), report, known)
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        parts = [
            pool.submit(compile_shard, arch, shapes, table, table_dtypes, (i, jobs), report, known)
            for i in range(jobs)
        ]
        return [row for part in parts for row in part.result()]
