"""The tensor-parallel group: one process group per engine, and the three collectives the
sharded layers use. A rank that stops answering fails the step instead of hanging it: rank
0 times each step against LORAPLEX_TP_TIMEOUT_SECONDS, which the group's start waits too;
its collectives give up after twice that, a backstop (fail_fast.py)."""

import datetime
import math
import os
import socket

import torch
import torch.distributed as dist

from ..errors import ConfigError
from .fail_fast import backend_for, group_timeout, prepare_backend

TIMEOUT_ENV = "LORAPLEX_TP_TIMEOUT_SECONDS"
DEFAULT_TIMEOUT_SECONDS = 120.0


def timeout_seconds() -> float:
    """How long a tensor-parallel step may take before a silent rank fails the engine (read
    from the environment, which the worker processes inherit)."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return value


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def join_group(address: str, rank: int, size: int, device: torch.device) -> None:
    """Join the group: gloo on CPU, NCCL on CUDA (one device per rank), set to fail fast."""
    backend = backend_for(device)
    prepare_backend(backend)
    deadline = timeout_seconds()
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    # the start waits the deadline for every rank; the collectives, their backstop
    store = dist.TCPStore(
        host,
        int(port),
        size,
        is_master=rank == 0,
        timeout=datetime.timedelta(seconds=deadline),
    )
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=size, timeout=group_timeout(deadline)
    )


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x


def all_gather_last(x: torch.Tensor) -> torch.Tensor:
    """Every rank's `x` side by side along the last dimension, in rank order."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def min_over_ranks(value: int, device: torch.device) -> int:
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())
