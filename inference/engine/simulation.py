"""A deployment's traffic replayed through the engine on the emulated device, on a virtual
clock: a step's device time is added to the clock instead of waited for, the host's time
(scheduling, inputs, adapter loads) is the real time it took, and an idle engine skips to
the next arrival. So a ten-minute trace runs in the time its host work takes."""

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .emulation.adapters import tenant_adapters
from .emulation.runner import EmulatedModelRunner
from .llm_engine import LLMEngine
from .planning import engine_options
from .planning.traffic import zipf_weights
from .request import EngineRequest, LoRARequest
from .sampling_params import SamplingParams


@dataclass(frozen=True)
class Traffic:
    """Requests arrive by a Poisson process at `rate` a second for `duration` simulated
    seconds, each on a tenant's adapter drawn by Zipf's law (or by `usage_counts`), with
    prompt and output lengths drawn uniformly from half to one and a half their means."""

    rate: float
    duration: float
    tenants: int = 100
    zipf: float = 1.1
    usage_counts: Sequence[int] | None = None
    prompt_tokens: int = 1024
    output_tokens: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.rate > 0 or not self.duration > 0:
            raise ValueError(
                f"rate and duration must be positive, got {self.rate}, {self.duration}"
            )
        for name in ("tenants", "prompt_tokens", "output_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.usage_counts is not None and len(self.usage_counts) != self.tenants:
            raise ValueError("usage counts must give one count per tenant")

    def arrivals(self, vocab_size: int, max_len: int) -> list[tuple[float, int, list[int], int]]:
        """(time, tenant, prompt token ids, max tokens) in order of arrival; a request's
        prompt is cut to leave room for its output within `max_len` tokens."""
        rng = random.Random(self.seed)
        weights = (
            [float(c) for c in self.usage_counts]
            if self.usage_counts is not None
            else zipf_weights(self.tenants, self.zipf)
        )
        out, t = [], rng.expovariate(self.rate)
        while t < self.duration:
            tenant = rng.choices(range(self.tenants), weights=weights)[0]
            answer = min(max(1, round(self.output_tokens * rng.uniform(0.5, 1.5))), max_len - 1)
            n = min(max(1, round(self.prompt_tokens * rng.uniform(0.5, 1.5))), max_len - answer)
            prompt = [rng.randrange(100, vocab_size) for _ in range(n)]
            out.append((t, tenant, prompt, answer))
            t += rng.expovariate(self.rate)
        return out


@dataclass
class SimulationResult:
    requests: int
    simulated_seconds: float
    wall_seconds: float
    tokens_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p50_ms: float
    itl_p99_ms: float
    device_busy: float
    hit_rate: dict[str, float]
    swap_ins: int
    swap_in_seconds: float  # the device's time on adapter copies, which steps queue behind
    preemptions: int
    occupancy: list[dict[str, float]] = field(default_factory=list)  # sampled over time

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def occupancy_summary(self) -> dict[str, float]:
        """The pool's share held by KV blocks and by adapter slots, on average and at peak."""
        if not self.occupancy:
            return {}
        pages = self.occupancy[0]["pages"] or 1
        kv = [s["kv_pages"] / pages for s in self.occupancy]
        adapters = [s["adapter_pages"] / pages for s in self.occupancy]
        return {
            "kv_mean": round(statistics.fmean(kv), 4),
            "kv_peak": round(max(kv), 4),
            "adapters_mean": round(statistics.fmean(adapters), 4),
            "adapters_peak": round(max(adapters), 4),
        }


class VirtualClock:
    """Real time spent on the host, plus the device's busy time, plus the idle time skipped."""

    def __init__(self, runner: EmulatedModelRunner):
        self.runner = runner
        self.start = time.perf_counter()
        self.skipped = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.start + self.runner.device.busy_seconds + self.skipped

    def skip_to(self, t: float) -> None:
        self.skipped += max(0.0, t - self.now())


def simulate(engine: LLMEngine, traffic: Traffic, adapters: list[Path]) -> SimulationResult:
    """Run `traffic` through `engine` (an emulated one, LoRA on) to the last request's end."""
    runner = engine.model_runner
    assert isinstance(runner, EmulatedModelRunner), "simulate needs an emulated engine"
    runner.device.sleeps = False  # the clock counts the device's time instead
    pending = traffic.arrivals(engine.config.model_config.vocab_size, engine.max_seq_len)
    total = len(pending)
    pending.reverse()
    clock = VirtualClock(runner)
    arrived: dict[str, float] = {}
    last: dict[str, float] = {}
    ttfts: list[float] = []
    gaps: list[float] = []
    tokens = 0
    occupancy: list[dict[str, float]] = []
    sample_every = max(traffic.duration / 200, 1e-3)
    next_sample = 0.0
    wall = time.perf_counter()
    while pending or engine.has_unfinished():
        if pending and not engine.has_unfinished():
            clock.skip_to(pending[-1][0])
        now = clock.now()
        while pending and pending[-1][0] <= now:
            at, tenant, prompt, max_tokens = pending.pop()
            request_id = f"r{len(arrived)}"
            arrived[request_id] = at
            lora = LoRARequest(f"tenant-{tenant}", f"tenant-{tenant}", adapters[tenant])
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
            request = EngineRequest(request_id, prompt_token_ids=prompt, sampling_params=params,
                                    lora_request=lora)  # fmt: skip
            engine.add_request(request)
        steps = engine.num_steps
        outputs = engine.step()
        if engine.num_steps == steps and not outputs:
            time.sleep(0.001)  # only adapter loads under way: let the loader threads run
        now = clock.now()
        for out in outputs:
            n = len(out.new_token_ids)
            if not n:
                continue
            tokens += n
            if out.request_id in last:
                gaps.append((now - last[out.request_id]) / n)
            else:
                ttfts.append(now - arrived[out.request_id])
            last[out.request_id] = now
        if now >= next_sample:
            occupancy.append(_occupancy(engine, now))
            next_sample = now + sample_every
    end = clock.now()
    stats = engine.stats()
    lora_slots = runner.lora_slots
    lora = stats["lora"]
    requests = lora["lookups"]["device"] or 1  # every request looks on the device first
    device, host = lora["hits"]["device"] / requests, lora["hits"]["host"] / requests
    return SimulationResult(
        requests=total,
        simulated_seconds=round(end, 3),
        wall_seconds=round(time.perf_counter() - wall, 3),
        tokens_per_s=round(tokens / end, 1) if end else 0.0,
        ttft_p50_s=round(_percentile(ttfts, 50), 4),
        ttft_p99_s=round(_percentile(ttfts, 99), 4),
        itl_p50_ms=round(1000 * _percentile(gaps, 50), 3),
        itl_p99_ms=round(1000 * _percentile(gaps, 99), 3),
        device_busy=round(runner.device.busy_seconds / end, 4) if end else 0.0,
        # as the plan gives them: where each request found its adapter
        hit_rate={
            "device": round(device, 4),
            "host": round(host, 4),
            "disk": round(1 - device - host, 4),
        },
        swap_ins=int(stats["lora_swap_in"]["count"]),
        swap_in_seconds=round(lora_slots.swap_in_seconds, 4) if lora_slots else 0.0,
        preemptions=stats["preemptions"],
        occupancy=occupancy,
    )


def _occupancy(engine: LLMEngine, now: float) -> dict[str, float]:
    pool = engine.pool_stats()
    by_use = pool["by_use"]
    return {
        "t": round(now, 3),
        "kv_pages": by_use["running_kv"] + by_use["cached_prefixes"],
        "adapter_pages": by_use["adapters_in_use"] + by_use["adapters_idle"],
        "pages": pool["pages"],
        "running": len(engine.scheduler.running),
        "waiting": len(engine.scheduler.waiting),
    }


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return (
        statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]
        if len(values) > 1
        else values[0]
    )


def simulate_deployment(
    served: Path,
    emulated: dict[str, Any],
    settings: dict[str, int | float | str],
    traffic: Traffic,
    adapters_root: Path,
) -> SimulationResult:
    """A plan's deployment (`emulated`: emulate_device, emulate_model, emulate_quantization,
    `settings`: its LORAPLEX_* settings) serving `traffic`, with `served`'s tokenizer and a
    rank-`max_lora_rank` adapter on every target for each tenant."""
    options = engine_options(settings)
    rank = int(options["max_lora_rank"])
    targets = tuple(emulated.pop("targets"))
    engine = LLMEngine(model=served, enable_lora=True, **emulated, **options)
    try:
        adapters = tenant_adapters(served, adapters_root, traffic.tenants, rank, targets)
        return simulate(engine, traffic, adapters)
    finally:
        engine.close()
