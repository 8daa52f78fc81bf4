"""Every size the GPU suite uses: the GPU's (bf16, Llama-3-8B shapes), or --interpret's tiny
ones (CPU, fp32, Triton's interpreter). Plain data, so the parent and `--plan` need no torch."""

from dataclasses import dataclass


@dataclass(frozen=True)
class TraceSizes:
    """The pool_trace section's trace (bench/memory_pool_trace.py's options of those names)."""

    adapter_requests: int
    adapter_concurrency: int
    short_output: int
    kv_requests: int
    kv_concurrency: int
    long_prompt: int
    long_output: int
    splits: tuple[int, ...]  # the fixed splits' slot counts


@dataclass(frozen=True)
class Profile:
    name: str
    device: str
    dtype: str
    attention_backend: str
    correctness_shape: tuple[int, ...]  # hidden, layers, heads, kv heads, ffn, vocab, positions
    correctness_tokens: int
    correctness_prompt: int
    big_shape: tuple[int, ...] | None  # None: Llama-3-8B
    init_std: float
    batches: tuple[int, ...]
    prompt_len: int
    warm_steps: int
    decode_steps: int
    hf_batches: tuple[int, ...]
    hf_steps: int
    adapters: int
    swap_reps: int
    ttft_prompt: int
    ttft_repeats: int
    copy_bytes: int
    max_model_len: int
    kv_cache_bytes: int
    block_size: int
    trace: TraceSizes

    @property
    def interpret(self) -> bool:
        return self.device != "cuda"


GPU = Profile(
    name="gpu", device="cuda", dtype="bfloat16", attention_backend="auto",
    correctness_shape=(1024, 4, 8, 2, 3584, 4096, 2048), correctness_tokens=64,
    correctness_prompt=32, big_shape=None, init_std=0.05, batches=(1, 32, 128), prompt_len=128,
    warm_steps=3, decode_steps=24, hf_batches=(1, 32, 128), hf_steps=16, adapters=32,
    swap_reps=200, ttft_prompt=1000, ttft_repeats=3, copy_bytes=1 << 30, max_model_len=2048,
    kv_cache_bytes=24 << 30, block_size=16,
    trace=TraceSizes(adapter_requests=128, adapter_concurrency=64, short_output=32,
                     kv_requests=32, kv_concurrency=16, long_prompt=1792, long_output=128,
                     splits=(4, 16)),
)  # fmt: skip
INTERPRET = Profile(
    name="interpret", device="cpu", dtype="float32", attention_backend="triton",
    correctness_shape=(64, 2, 4, 2, 128, 512, 256), correctness_tokens=8, correctness_prompt=6,
    big_shape=(64, 2, 4, 2, 128, 512, 256), init_std=0.1, batches=(1, 2, 4), prompt_len=5,
    warm_steps=1, decode_steps=2, hf_batches=(1, 4), hf_steps=2, adapters=4, swap_reps=10,
    ttft_prompt=40, ttft_repeats=1, copy_bytes=1 << 20, max_model_len=256, kv_cache_bytes=1 << 22,
    block_size=16,
    trace=TraceSizes(adapter_requests=6, adapter_concurrency=3, short_output=2, kv_requests=2,
                     kv_concurrency=2, long_prompt=40, long_output=4, splits=(4, 2)),
)  # fmt: skip
PROFILES = {p.name: p for p in (GPU, INTERPRET)}
