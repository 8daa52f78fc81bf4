"""What makes two launches of a Triton kernel need two compiled variants, and a way to see
every launch the engine's kernel wrappers make.

Triton compiles a variant per specialisation: the values of the constexpr arguments, the
dtype of each tensor and whether its address is 16-byte aligned, the type of each int and
whether it is 1 or a multiple of 16 (unless the kernel says not to specialise it), and the
launch options (num_warps, num_stages). `launch_key` writes that down without compiling,
the same on a GPU, under the interpreter and on meta tensors, so the keys of launches seen
anywhere can be compared with the set warm-up compiles.

`intercepted` routes every launch of the engine's kernels through a handler, which may
record it, compile it (`warmup=True`) or run it; the wrappers are not changed.
"""

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True, order=True)
class LaunchKey:
    """One compiled variant: the kernel and its specialisation."""

    kernel: str
    constexprs: tuple[tuple[str, Any], ...]
    args: tuple[tuple[str, str], ...]  # (name, type and specialisation) of the others
    options: tuple[tuple[str, Any], ...]  # num_warps, num_stages, ...

    def describe(self) -> str:
        constexprs = ", ".join(f"{k}={v}" for k, v in self.constexprs)
        options = ", ".join(f"{k}={v}" for k, v in self.options)
        return f"{self.kernel}[{options}]({constexprs})"

    @property
    def dtype(self) -> str:
        """The dtype of the model's tensors in the launch: its first tensor argument that is
        neither an index nor fp32 scratch, else float32."""
        dtypes = [t[1:].split(":")[0] for _, t in self.args if t.startswith("*")]
        return next((d for d in dtypes if d in ("bfloat16", "float16")), "float32")


def _param_names(kernel: Any) -> tuple[list[str], set[str], set[str]]:
    """The kernel's argument names, the constexpr ones, and those it does not specialise."""
    fn = kernel.fn
    params = inspect.signature(fn).parameters.values()
    names = [p.name for p in params]
    constexprs = {p.name for p in params if "constexpr" in str(p.annotation)}
    raw = getattr(kernel, "do_not_specialize", None)
    if raw is None:  # the interpreter keeps jit's arguments
        raw = getattr(kernel, "kwargs", {}).get("do_not_specialize")
    unspecialised = {names[i] if isinstance(i, int) else i for i in raw or ()}
    return names, constexprs, unspecialised


def _arg_type(value: Any, specialise: bool) -> str:
    if isinstance(value, torch.Tensor):
        aligned = value.data_ptr() % 16 == 0
        return f"*{str(value.dtype).removeprefix('torch.')}" + (":16" if aligned else "")
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        kind = "i32" if INT32[0] <= value <= INT32[1] else "i64" if value >= INT64[0] else "u64"
        if not specialise:
            return kind
        return f"{kind}:1" if value == 1 else f"{kind}:16" if value % 16 == 0 else kind
    if isinstance(value, float):
        return "fp32"
    if value is None:
        return "none"
    raise TypeError(f"no launch key for an argument of type {type(value).__name__}")


def launch_key(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> LaunchKey:
    """The specialisation of `kernel[grid](*args, **kwargs)` (see the module docstring)."""
    names, constexprs, unspecialised = _param_names(kernel)
    bound = dict(zip(names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in names}
    options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in names))
    consts = tuple((n, bound[n]) for n in names if n in constexprs)
    types = tuple(
        (n, _arg_type(bound[n], n not in unspecialised)) for n in names if n not in constexprs
    )
    return LaunchKey(kernel.fn.__name__, consts, types, options)


# handler(kernel, key, run, grid, args, kwargs) -> what the launch returns
Handler = Callable[[Any, LaunchKey, Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]


def engine_kernels() -> list[Any]:
    """Every Triton kernel the engine launches (importing them needs triton)."""
    from inference.kernels import paged_attention_kernels as attention
    from inference.kernels import quant_kernels as quant
    from inference.kernels import triton_kernels as lora

    return [
        lora.sgmv_shrink_kernel,
        lora.bgmv_shrink_kernel,
        lora.sgmv_expand_kernel,
        lora.bgmv_expand_kernel,
        attention.paged_decode_kernel,
        attention.paged_decode_reduce_kernel,
        attention.paged_extend_kernel,
        quant.int_weight_gemm_kernel,
        quant.fp8_quantize_rows_kernel,
        quant.fp8_gemm_kernel,
        quant.fp8_weight_only_gemm_kernel,
    ]


@contextmanager
def intercepted(handler: Handler) -> Iterator[None]:
    """Route every launch of the engine's kernels through `handler`, which gets the
    launch's key and the kernel's own `run` (to call with `warmup=` as it chooses). Launch
    syntax `kernel[grid](...)` calls the kernel's `run`, which is swapped for the block."""
    kernels = engine_kernels()

    def routed(kernel: Any, run: Callable[..., Any], *args: Any, grid: Any, warmup: bool,
               **kwargs: Any) -> Any:  # fmt: skip
        return handler(kernel, launch_key(kernel, args, kwargs), run, grid, args, kwargs)

    for kernel in kernels:
        if "run" in vars(kernel):
            raise RuntimeError(f"{kernel.fn.__name__}'s launches are already intercepted")
        kernel.run = functools.partial(routed, kernel, kernel.run)
    try:
        yield
    finally:
        for kernel in kernels:
            del kernel.run


@contextmanager
def recorded_launches(execute: bool = True) -> Iterator[list[LaunchKey]]:
    """The key of every launch of the engine's kernels in the block, in order; with
    `execute` each launch also runs (on a GPU or under the interpreter)."""
    keys: list[LaunchKey] = []

    def record(kernel: Any, key: LaunchKey, run: Callable[..., Any], grid: Any,
               args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:  # fmt: skip
        keys.append(key)
        return run(*args, grid=grid, warmup=False, **kwargs) if execute else None

    with intercepted(record):
        yield keys
