"""Compile every variant an engine can launch, each once: the launches of
`variants.launch_all` go through `intercepted`, and a launch whose key is new is compiled
(`warmup=True`: nothing runs). With `compile_target` (target.py) around it this needs no
GPU; on a GPU it fills Triton's caches for the device itself.

`shard=(i, n)` compiles only every n-th new key from the i-th: n processes, each running
the same enumeration, compile the whole set between them into Triton's on-disk cache.
With `known` (records.py), a variant whose fingerprint is recorded is not compiled, except
the first of each kernel and dtype, which is compiled to check the record.
"""

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from inference.kernels.lora_tiles import TileTable

from .launches import LaunchKey, intercepted, recorded_launches
from .records import fingerprint
from .resources import Resources
from .shapes import EngineShapes
from .variants import launch_all, tile_table_launches


@dataclass
class Variant:
    key: LaunchKey
    shapes: str  # the first deployment that launched it
    kernel: Any = None  # the CompiledKernel; None when another shard compiles it
    seconds: float = 0.0
    error: str | None = None
    fingerprint: str = ""
    recorded: Resources | None = None  # what the record says, when it has the variant
    reported: bool = True  # False when another shard reports it


@dataclass
class Compilation:
    """The distinct variants met, in the order first met."""

    shard: tuple[int, int] = (0, 1)
    arch: int | None = None  # the target, for fingerprints; None: no record is used
    known: Mapping[str, Resources] = field(default_factory=dict)
    variants: dict[LaunchKey, Variant] = field(default_factory=dict)
    current: str = ""
    checked: set[tuple[str, str]] = field(default_factory=set)  # (kernel, dtype) re-compiled
    to_compile: int = 0

    def handle(self, kernel: Any, key: LaunchKey, run: Callable[..., Any], grid: Any,
               args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:  # fmt: skip
        variant = self.variants.get(key)
        if variant is not None:
            return variant.kernel
        variant = self.variants[key] = Variant(key, self.current)
        index, count = self.shard
        if self.arch is not None:
            variant.fingerprint = fingerprint(kernel, key, self.arch)
            variant.recorded = self.known.get(variant.fingerprint)
        if variant.recorded is not None and (key.kernel, key.dtype) in self.checked:
            variant.reported = index == 0
            return None
        if variant.recorded is not None:
            self.checked.add((key.kernel, key.dtype))
        self.to_compile += 1
        if (self.to_compile - 1) % count != index:
            variant.reported = False
            return None
        start = time.perf_counter()
        try:
            variant.kernel = run(*args, grid=grid, warmup=True, **kwargs)
        except Exception as error:  # reported with its key, the other variants still compile
            variant.error = f"{type(error).__name__}: {error}".strip()[-2000:]
        variant.seconds = time.perf_counter() - start
        return variant.kernel


def compile_all(
    shapes: Iterable[EngineShapes],
    table: TileTable,
    shard: tuple[int, int] = (0, 1),
    table_dtypes: Iterable[torch.dtype] = (),
    arch: int | None = None,
    known: Mapping[str, Resources] | None = None,
) -> Compilation:
    """Compile (this shard of) every variant engines of these shapes launch, and those of
    every entry of `table` in each of `table_dtypes`; with `arch` and `known`, only those
    the record does not have (and one of each kernel and dtype that it has)."""
    compilation = Compilation(shard, arch, known or {})
    done: set[object] = set()
    with intercepted(compilation.handle):
        for s in shapes:
            compilation.current = s.name
            launch_all(s, table, done)
        for dtype in table_dtypes:
            compilation.current = f"tile table/{str(dtype).removeprefix('torch.')}"
            tile_table_launches(table, dtype)
    return compilation


def listed_keys(shapes: Iterable[EngineShapes], table: TileTable) -> set[LaunchKey]:
    """The keys of every variant engines of these shapes launch, compiling nothing."""
    done: set[object] = set()
    with recorded_launches(execute=False) as keys:
        for s in shapes:
            launch_all(s, table, done)
    return set(keys)
