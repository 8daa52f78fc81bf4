"""Compile, at start-up, every Triton kernel variant this engine can launch, so no request
ever waits on a compile (seconds each on a GPU) and the engine is ready only once none is
left.

Which variants an engine launches follows from its configuration alone: the shapes of one
rank's share of the model, the dtype, the LoRA rank, the step and batch sizes, and the tile
table of its device (kernels/compilation/variants.py makes each of those launches on meta
tensors). Triton's compiler holds the GIL for most of its work, so the variants compile in
several processes first (into Triton's on-disk cache), then once more here, where each is
a cache load that puts the kernel in this process's in-memory cache for the device.
"""

import json
import logging
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from inference.kernels import select_backend
from inference.kernels.lora_tiles import TileTable, table_for_gpu
from inference.kernels.tile_limits import device_limits

from .config import EngineConfig
from .cuda_graphs import capture_sizes
from .parallel.plan import ShardPlan

if TYPE_CHECKING:  # the compilation package imports triton: only where kernels compile
    from inference.kernels.compilation import EngineShapes, LaunchKey

logger = logging.getLogger(__name__)

# Compiling processes beyond these gain little: each also imports torch and lists every launch
MAX_COMPILE_JOBS = 16
VARIANTS_PER_JOB = 4


@dataclass
class KernelWarmup:
    """What start-up compiled: the variants, the seconds it took, and the variants that
    failed to compile (each would fail again on its first launch)."""

    variants: int
    seconds: float
    jobs: int
    failures: list[str] = field(default_factory=list)


def engine_shapes(config: EngineConfig) -> "EngineShapes":
    """The sizes that pick this engine's kernel variants: rank 0's share of the model
    (every rank's is the same), no LoRA launches unless its LoRA backend is Triton, and the
    quantized GEMMs of a quantized base when its kernels are (quant_ops picks them alike)."""
    from inference.kernels.compilation import EngineShapes

    mc = config.model_config
    scheme = mc.quantization
    quantized = scheme is not None and select_backend(config.device) == "triton"
    if config.tensor_parallel_size > 1:
        mc = ShardPlan(0, config.tensor_parallel_size, mc).local_config()
    assert config.max_model_len is not None and config.max_num_batched_tokens is not None
    assert config.max_cudagraph_capture_size is not None  # all resolved by EngineConfig
    graphs = (
        config.attention_backend == "triton"
        and not config.enforce_eager
        and config.tensor_parallel_size == 1
    )
    lora = config.enable_lora and select_backend(config.device) == "triton"
    return EngineShapes(
        name=f"{Path(config.model).name}/tp{config.tensor_parallel_size}",
        dtype=config.torch_dtype,
        hidden=mc.hidden_size,
        intermediate=mc.intermediate_size,
        num_heads=mc.num_heads,
        num_kv_heads=mc.num_kv_heads,
        head_dim=mc.head_dim,
        windows=tuple(sorted(set(mc.layer_windows or (None,)), key=lambda w: w or 0)),
        softcap=mc.attn_softcap,
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        block_size=config.block_size,
        graph_sizes=tuple(capture_sizes(config.max_cudagraph_capture_size)) if graphs else (),
        lora_rank=config.max_lora_rank if lora else 0,
        # the slot count reaches no kernel's specialisation (the slot stride travels in the
        # kernels' pointer tables), so the pool's choice of it compiles nothing new
        max_loras=config.max_loras or EngineShapes.max_loras,
        deterministic=config.deterministic_kernels,
        quant_schemes=(scheme.name,) if quantized and scheme is not None else (),
        quant_scale_dtype=checkpoint_dtype(config.model) if quantized else None,
        tensor_parallel=config.tensor_parallel_size,
    )


def checkpoint_dtype(model: str | Path) -> "torch.dtype | None":
    """The dtype config.json says the checkpoint's float tensors are stored in (its
    quantization scales among them); None when it does not say."""
    try:
        raw = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    name = (raw.get("torch_dtype") or raw.get("dtype")) if isinstance(raw, dict) else None
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


def launches_kernels(config: EngineConfig) -> bool:
    """Whether the engine launches Triton kernels at all (paged attention, LoRA or the
    quantized GEMMs)."""
    triton = select_backend(config.device) == "triton"
    lora = config.enable_lora and triton
    quantized = config.model_config.quantization is not None and triton
    return config.attention_backend == "triton" or lora or quantized


def tile_table(device: torch.device, itemsize: int) -> TileTable:
    """The LoRA tile table the kernels look up on `device` (lora_triton's, read once)."""
    if device.type != "cuda":
        return table_for_gpu(None)
    name = torch.cuda.get_device_name(device)
    return table_for_gpu(name, limits=device_limits(device), itemsize=itemsize)


def listed_variants(config: EngineConfig) -> "set[LaunchKey]":
    """Every kernel variant this engine can launch, compiling nothing."""
    from inference.kernels.compilation.compile import listed_keys

    if not launches_kernels(config):
        return set()
    device = torch.device(config.device)
    return listed_keys([engine_shapes(config)], tile_table(device, config.torch_dtype.itemsize))


def compile_jobs(config: EngineConfig, variants: int) -> int:
    """Processes to compile in: a tensor-parallel worker rank (a daemonic process, which
    may not start others) compiles in its own, one CPU each; rank 0 takes the CPUs left,
    no more than keeps each process busy with a few variants (each first imports torch)."""
    if multiprocessing.current_process().daemon:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    share = (cpus or 1) - (config.tensor_parallel_size - 1)
    return max(1, min(MAX_COMPILE_JOBS, share, -(-variants // VARIANTS_PER_JOB)))


def compile_kernels(config: EngineConfig, device: torch.device) -> KernelWarmup | None:
    """On CUDA, compile every variant the engine can launch before it serves; None
    elsewhere (the interpreter compiles nothing) or when it launches no Triton kernel."""
    if device.type != "cuda" or not launches_kernels(config):
        return None
    from inference.kernels.compilation.compile import listed_keys

    start = time.perf_counter()
    shapes = engine_shapes(config)
    table = tile_table(device, config.torch_dtype.itemsize)
    jobs = compile_jobs(config, len(listed_keys([shapes], table)))
    major, minor = torch.cuda.get_device_capability(device)
    with torch.cuda.device(device):
        warmup = compile_listed(shapes, table, major * 10 + minor, jobs)
    warmup.seconds = time.perf_counter() - start
    logger.info(
        "compiled %d kernel variants in %.1f s (%d processes)",
        warmup.variants,
        warmup.seconds,
        warmup.jobs,
    )
    for failure in warmup.failures:  # the engine still starts: only a launch of it would fail
        logger.error("kernel variant does not compile: %s", failure)
    return warmup


def compile_listed(shapes: "EngineShapes", table: TileTable, arch: int, jobs: int) -> KernelWarmup:
    """Compile every variant of `shapes` for sm_<arch> into Triton's disk cache in `jobs`
    processes, then in this process for Triton's active driver (the device's), where each
    is a load from that cache. Errors are reported, not raised."""
    from inference.kernels.compilation.compile import compile_all
    from inference.kernels.compilation.parallel import compile_sharded

    start = time.perf_counter()
    # Part of Triton's cache key: the compiling processes set it (to its default, fusion
    # on), and a variant they compiled is a cache hit here only with the same value
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    if jobs > 1:
        try:  # what the processes miss compiles below all the same
            compile_sharded(arch, [shapes], table, [], jobs, report=False)
        except Exception:
            logger.warning("compiling kernels in %d processes failed; compiling here", jobs,
                           exc_info=True)  # fmt: skip
            jobs = 1
    compilation = compile_all([shapes], table)
    failures = [
        f"{key.describe()}: {variant.error}"
        for key, variant in compilation.variants.items()
        if variant.error is not None
    ]
    return KernelWarmup(len(compilation.variants), time.perf_counter() - start, jobs, failures)
