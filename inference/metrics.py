"""Prometheus metrics: names in one place, `loraplex_` prefix, base units, `_total` counters.

Engine numbers are read from the engine's own counters at scrape time (a custom
collector), so the step thread never touches prometheus_client. Web-layer numbers
(requests by status and endpoint) are plain prometheus_client counters. No key, user or
tenant ids become labels: their number is unbounded. Adapter names (`tenant/adapter`) appear
only in the router gauge, and only when scrapers must send LORAPLEX_METRICS_TOKEN.
"""

import time

from django.conf import settings
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from registry.staged_copies import restage_counts

REGISTRY = CollectorRegistry(auto_describe=True)

HTTP_REQUESTS = Counter(
    "loraplex_http_requests",
    "OpenAI-compatible API requests by endpoint and HTTP status.",
    ["endpoint", "status"],
    registry=REGISTRY,
)

RATELIMIT_BACKEND_ERRORS = Counter(
    "loraplex_ratelimit_backend_errors",
    "Rate-limit operations the shared cache (Redis) failed; the request was served unlimited.",
    registry=REGISTRY,
)


class RestageCollector:
    """Staged adapter copies this process found damaged on disk and fetched again from object
    storage (registry/staged_copies.py counts them), by how the damage was found."""

    def collect(self):
        family = CounterMetricFamily(
            "loraplex_adapter_restages",
            "Staged adapter copies found damaged on this host's disk and fetched again from "
            "object storage, by how: size (a file of another size), modified (written since "
            "it was verified, its sha256 no longer the recorded one), load_failed (the engine "
            "could not load it, and its sha256 is not the recorded one).",
            labels=["reason"],
        )
        for reason, count in restage_counts().items():
            family.add_metric([reason], count)
        yield family


REGISTRY.register(RestageCollector())

_HISTOGRAMS = {
    "time_to_first_token": ("loraplex_time_to_first_token_seconds", "Arrival to first token."),
    "inter_token_latency": (
        "loraplex_inter_token_latency_seconds",
        "Time between tokens of a request.",
    ),
    "e2e_latency": ("loraplex_e2e_request_latency_seconds", "Arrival to finish."),
    "queue_time": ("loraplex_request_queue_time_seconds", "Arrival to first scheduled."),
    "lora_swap_in": (
        "loraplex_lora_swap_in_seconds",
        "Copying an adapter from host memory into a device slot.",
    ),
    "lora_load": (
        "loraplex_lora_load_seconds",
        "Loading an adapter from disk (or object storage) to host memory.",
    ),
}


class EngineCollector:
    """Reads `stats()` of the engine hosted in this process, if any, at each scrape."""

    def __init__(self, stats_source):
        self.stats_source = stats_source  # () -> dict | None

    def collect(self):
        stats = self.stats_source()
        if stats is None:
            return
        yield _gauge(
            "loraplex_requests_running", "Requests in the running batch.", stats["requests_running"]
        )
        yield _gauge(
            "loraplex_requests_waiting",
            "Requests waiting to be scheduled.",
            stats["requests_waiting"],
        )
        used, total = stats["kv_blocks_used"], stats["kv_blocks_total"]
        yield _gauge("loraplex_kv_cache_blocks_used", "KV cache blocks in use.", used)
        yield _gauge("loraplex_kv_cache_blocks_total", "KV cache blocks in the budget.", total)
        yield _gauge(
            "loraplex_kv_cache_usage_ratio",
            "Share of KV cache blocks in use (0-1).",
            used / max(total, 1),
        )
        yield _counter("loraplex_prompt_tokens", "Prompt tokens processed.", stats["prompt_tokens"])
        yield _counter(
            "loraplex_generation_tokens", "Tokens generated.", stats["generation_tokens"]
        )
        yield _counter(
            "loraplex_preemptions",
            "Requests preempted for lack of KV blocks.",
            stats["preemptions"],
        )
        yield from _prefix_cache_metrics(stats)
        finished = CounterMetricFamily(
            "loraplex_requests_finished", "Finished requests by reason.", labels=["finish_reason"]
        )
        for reason, count in stats["finished"].items():
            finished.add_metric([reason], count)
        yield finished
        for key, (name, doc) in _HISTOGRAMS.items():
            if key in stats:
                yield _histogram(name, doc, stats[key])
        lora = stats.get("lora")
        if lora:
            yield from _lora_metrics(lora)
        yield from _vllm_compatible(stats)


def _lora_metrics(lora: dict):
    lookups = CounterMetricFamily(
        "loraplex_lora_lookups", "Adapter lookups by the tier asked.", labels=["tier"]
    )
    hits = CounterMetricFamily(
        "loraplex_lora_hits", "Adapter lookups answered by that tier.", labels=["tier"]
    )
    for tier, count in lora.get("lookups", {}).items():
        lookups.add_metric([tier], count)
    for tier, count in lora.get("hits", {}).items():
        hits.add_metric([tier], count)
    yield lookups
    yield hits
    yield _counter(
        "loraplex_lora_loads", "Adapter loads from disk or object storage.", lora.get("loads", 0)
    )
    yield _counter(
        "loraplex_lora_load_failures", "Adapter loads that failed.", lora.get("load_failures", 0)
    )
    evictions = CounterMetricFamily(
        "loraplex_lora_evictions", "Adapters evicted, by tier.", labels=["tier"]
    )
    for tier, count in lora.get("evictions", {}).items():
        evictions.add_metric([tier], count)
    yield evictions
    yield _gauge(
        "loraplex_lora_slots_used",
        "Device adapter slots holding an adapter.",
        lora.get("slots_used", 0),
    )
    yield _gauge(
        "loraplex_lora_slots_total", "Device adapter slots (max_loras).", lora.get("slots_total", 0)
    )
    yield _gauge(
        "loraplex_lora_waiting_adapters",
        "Adapters that requests wait for.",
        lora.get("adapters_waiting", 0),
    )


# The engine's prefix cache counters, in tokens: stats key -> (our help, vLLM v1's help).
_PREFIX_CACHE_COUNTERS = {
    "prefix_cache_queries": (
        "Prompt tokens looked up in the prefix cache.",
        "Prefix cache queries, in queried tokens (vLLM-compatible).",
    ),
    "prefix_cache_hits": (
        "Prompt tokens found in the prefix cache (not computed again).",
        "Prefix cache hits, in cached tokens (vLLM-compatible).",
    ),
}


def _prefix_cache_metrics(stats: dict):
    """Counted in tokens, so hits / queries is the share of prompt tokens not recomputed."""
    for key, (doc, _) in _PREFIX_CACHE_COUNTERS.items():
        yield _counter(f"loraplex_{key}", doc, stats.get(key, 0))
    yield _gauge(
        "loraplex_prefix_cache_blocks",
        "KV cache blocks the prefix cache holds now.",
        stats.get("prefix_cache_blocks", 0),
    )


def _vllm_compatible(stats: dict):
    """The gauges LoRA-aware routers (Gateway API Inference Extension, llm-d) read, and vLLM
    v1's prefix cache counters (in tokens), under vLLM's names."""
    yield _gauge(
        "vllm:num_requests_waiting",
        "Requests waiting (vLLM-compatible).",
        stats["requests_waiting"],
    )
    used, total = stats["kv_blocks_used"], stats["kv_blocks_total"]
    yield _gauge(
        "vllm:kv_cache_usage_perc", "KV cache usage, 0-1 (vLLM-compatible).", used / max(total, 1)
    )
    for key, (_, doc) in _PREFIX_CACHE_COUNTERS.items():
        yield _counter(f"vllm:{key}", doc, stats.get(key, 0))
    lora = stats.get("lora") or {}
    running, waiting = lora.get("running_adapters", []), lora.get("waiting_adapter_names", [])
    if not adapter_names_shown():
        running, waiting = [], []  # the gauge stays, for routers; the tenants' names go
    info = GaugeMetricFamily(
        "vllm:lora_requests_info",
        "Running and waiting adapters (vLLM-compatible).",
        labels=["running_lora_adapters", "waiting_lora_adapters", "max_lora"],
    )
    info.add_metric(
        [
            ",".join(running),
            ",".join(waiting),
            str(lora.get("slots_total", 0)),
        ],
        time.time(),  # as vLLM does: routers read the newest sample
    )
    yield info


def adapter_names_shown() -> bool:
    """Names tell who the tenants are and what they run: only for scrapers holding the token."""
    return bool(settings.METRICS_TOKEN)


def _gauge(name, doc, value):
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name, doc, value):
    return CounterMetricFamily(name, doc, value=value)


def _histogram(name, doc, snapshot):
    buckets = [
        ("+Inf" if bound == float("inf") else repr(float(bound)), count)
        for bound, count in snapshot["buckets"]
    ]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=snapshot["sum"])


def render() -> bytes:
    return generate_latest(REGISTRY)
