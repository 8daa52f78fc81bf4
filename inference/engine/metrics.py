"""Engine metrics as plain counters and histograms; the serving layer exports them.

Written only by the step thread; readers on other threads take `snapshot()`, whose
numbers may be a step apart from each other but are each consistent.
"""

import bisect
from dataclasses import dataclass, field
from typing import Any

from .sequence import Sequence

# Seconds. Wide enough for a CPU serving a 135M model and a GPU serving an 8B one.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# A swap-in is a host-to-device copy: about a millisecond for an 8B model's rank-16 adapter.
SWAP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
LORA_TIERS = ("device", "host", "disk")
POOL_RESIZES = ("kv_to_adapter", "adapter_to_kv")
POOL_EVICTIONS = ("adapter_for_kv", "adapter_for_adapter", "prefix_for_adapter")


class Histogram:
    """Counts per bucket (upper bounds, plus +Inf), sum and count, as Prometheus keeps them."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def snapshot(self) -> dict[str, Any]:
        cumulative, total = [], 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            total += n
            cumulative.append((bound, total))
        return {"buckets": cumulative, "sum": self.sum, "count": self.count}


@dataclass
class EngineMetrics:
    prompt_tokens: int = 0  # counted once per request, not again when recomputed
    generation_tokens: int = 0
    preemptions: int = 0
    finished: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0})
    time_to_first_token: Histogram = field(default_factory=Histogram)
    inter_token_latency: Histogram = field(default_factory=Histogram)
    queue_time: Histogram = field(default_factory=Histogram)  # arrival to first scheduled
    e2e_latency: Histogram = field(default_factory=Histogram)  # arrival to finish
    # LoRA: a lookup counts at the tier asked, a hit where the adapter was found ("loader":
    # not on local disk, fetched by the loader callback), so hits / lookups is a tier's rate.
    lora_lookups: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LORA_TIERS, 0))
    lora_hits: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys((*LORA_TIERS, "loader"), 0)
    )
    lora_loads: int = 0  # loads started (single flight: one per cold adapter, not per request)
    lora_load_failures: int = 0
    lora_evictions: dict[str, int] = field(default_factory=lambda: {"device": 0, "host": 0})
    lora_swap_in: Histogram = field(default_factory=lambda: Histogram(SWAP_BUCKETS))
    lora_load: Histogram = field(default_factory=Histogram)  # disk (or loader) to host memory
    # The memory pool (memory_pool.py): pages passed between the KV side and adapter slots,
    # what was evicted to make room (an adapter for KV blocks or for another adapter, a
    # cached prefix for an adapter), and held blocks moved out of a slot group.
    pool_resizes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(POOL_RESIZES, 0))
    pool_evictions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(POOL_EVICTIONS, 0))
    pool_blocks_moved: int = 0

    def observe_token(self, seq: Sequence, now: float) -> None:
        """A generated token: counted, its latency observed and stamped on its sequence."""
        self.generation_tokens += 1
        if seq.first_token_time is None:
            seq.first_token_time = now
            self.time_to_first_token.observe(now - seq.arrival_time)
        elif seq.last_token_time is not None:
            self.inter_token_latency.observe(now - seq.last_token_time)
        seq.last_token_time = now

    def observe_finish(self, seq: Sequence, now: float) -> None:
        assert seq.finish_reason is not None
        self.finished[seq.finish_reason] += 1
        self.e2e_latency.observe(now - seq.arrival_time)

    def snapshot(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens,
            "preemptions": self.preemptions,
            "finished": dict(self.finished),
            "time_to_first_token": self.time_to_first_token.snapshot(),
            "inter_token_latency": self.inter_token_latency.snapshot(),
            "queue_time": self.queue_time.snapshot(),
            "e2e_latency": self.e2e_latency.snapshot(),
            "lora_swap_in": self.lora_swap_in.snapshot(),
            "lora_load": self.lora_load.snapshot(),
        }

    def lora_counters(self) -> dict[str, Any]:
        return {
            "lookups": dict(self.lora_lookups),
            "hits": dict(self.lora_hits),
            "loads": self.lora_loads,
            "load_failures": self.lora_load_failures,
            "evictions": dict(self.lora_evictions),
        }

    def pool_counters(self) -> dict[str, Any]:
        return {
            "resizes": dict(self.pool_resizes),
            "evictions": dict(self.pool_evictions),
            "blocks_moved": self.pool_blocks_moved,
        }
