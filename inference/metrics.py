"""Prometheus metrics: names in one place, `loraplex_` prefix, base units, `_total` counters;
and the engine's numbers that routers and dashboards read under vLLM's `vllm:` names too.

Engine numbers are read from the engine's own counters at scrape time (a custom
collector), so the step thread never touches prometheus_client. Web-layer numbers
(requests by status and endpoint) are plain prometheus_client counters. No key, user or
tenant ids become labels: their number is unbounded. Adapter model names (what clients send
as `model`) appear only in the router gauge, and only when scrapers must send
LORAPLEX_METRICS_TOKEN.
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

TOKENIZED_CHARACTERS = Counter(
    "loraplex_tokenized_characters",
    "Characters of callers' texts (prompts, rendered conversations, /tokenize) encoded.",
    registry=REGISTRY,
)

TOKENIZATIONS_REFUSED = Counter(
    "loraplex_tokenizations_refused",
    "Texts refused before tokenizing, by reason: too_long (over max_model_len x "
    "LORAPLEX_MAX_CHARS_PER_TOKEN characters), concurrency (the tenant's "
    "LORAPLEX_TENANT_MAX_TOKENIZATIONS were running).",
    ["reason"],
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

# Engine histograms: stats key -> our name, help, and the names vLLM's routers and
# dashboards read the same series under (the older time_per_output_token is what vLLM
# called the inter-token latency before it split the two).
_HISTOGRAMS = {
    "time_to_first_token": (
        "loraplex_time_to_first_token_seconds",
        "Arrival to first token.",
        ("vllm:time_to_first_token_seconds",),
    ),
    "inter_token_latency": (
        "loraplex_inter_token_latency_seconds",
        "Time between tokens of a request.",
        ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    ),
    "e2e_latency": (
        "loraplex_e2e_request_latency_seconds",
        "Arrival to finish.",
        ("vllm:e2e_request_latency_seconds",),
    ),
    "queue_time": (
        "loraplex_request_queue_time_seconds",
        "Arrival to first scheduled.",
        ("vllm:request_queue_time_seconds",),
    ),
    "lora_swap_in": (
        "loraplex_lora_swap_in_seconds",
        "Copying an adapter from host memory into a device slot.",
        (),
    ),
    "lora_load": (
        "loraplex_lora_load_seconds",
        "Loading an adapter from disk (or object storage) to host memory.",
        (),
    ),
}

# Engine counters: stats key -> our name (without `_total`), help, vLLM's name.
_COUNTERS = {
    "prompt_tokens": ("loraplex_prompt_tokens", "Prompt tokens processed.", "vllm:prompt_tokens"),
    "generation_tokens": (
        "loraplex_generation_tokens",
        "Tokens generated.",
        "vllm:generation_tokens",
    ),
    "preemptions": (
        "loraplex_preemptions",
        "Requests preempted for lack of KV blocks.",
        "vllm:num_preemptions",
    ),
}


class EngineCollector:
    """Reads `stats()` of the engine hosted in this process, if any, at each scrape. Each
    number is recorded once, by the engine, and exported under our name and, where a router
    or dashboard reads it, vLLM's (labelled `model_name`, the base model served, as vLLM's)."""

    def __init__(self, stats_source, model_name):
        self.stats_source = stats_source  # () -> dict | None
        self.model_name = model_name  # () -> the served base model's name, once started

    def collect(self):
        stats = self.stats_source()
        if stats is None:
            return
        vllm = _VllmNames(self.model_name())
        running, waiting = stats["requests_running"], stats["requests_waiting"]
        yield _gauge("loraplex_requests_running", "Requests in the running batch.", running)
        yield vllm.gauge("vllm:num_requests_running", "Requests in the running batch.", running)
        yield _gauge("loraplex_requests_waiting", "Requests waiting to be scheduled.", waiting)
        yield vllm.gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", waiting)
        used, total = stats["kv_blocks_used"], stats["kv_blocks_total"]
        usage = used / max(total, 1)
        yield _gauge("loraplex_kv_cache_blocks_used", "KV cache blocks in use.", used)
        yield _gauge("loraplex_kv_cache_blocks_total", "KV cache blocks in the budget.", total)
        yield _gauge(
            "loraplex_kv_cache_usage_ratio", "Share of KV cache blocks in use (0-1).", usage
        )
        for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):  # new, older
            yield vllm.gauge(name, "Share of KV cache blocks in use (0-1).", usage)
        if "weights_bytes" in stats:
            yield _gauge(
                "loraplex_weights_bytes",
                "Bytes the base model's weights take (quantized as stored; one rank's share "
                "under tensor parallelism).",
                stats["weights_bytes"],
            )
        if "engine_info" in stats:
            yield _engine_info(stats["engine_info"], self.model_name())
        for key, (name, doc, vllm_name) in _COUNTERS.items():
            yield _counter(name, doc, stats[key])
            yield vllm.counter(vllm_name, doc, stats[key])
        yield from _prefix_cache_metrics(stats, vllm)
        yield from _finished(stats["finished"], vllm)
        for key, (name, doc, vllm_names) in _HISTOGRAMS.items():
            if key in stats:
                yield _histogram(name, doc, stats[key])
                for vllm_name in vllm_names:
                    yield vllm.histogram(vllm_name, doc, stats[key])
        if "pool" in stats:
            yield from _pool_metrics(stats["pool"])
        if "emulated_device" in stats:
            yield from _emulated_device_metrics(stats["emulated_device"])
        lora = stats.get("lora")
        if lora:
            yield from _lora_metrics(lora)
        yield from _lora_requests_info(lora or {})


class _VllmNames:
    """vLLM's names label every series with the model served."""

    def __init__(self, model_name: str):
        self.labels = {"model_name": model_name}

    def gauge(self, name, doc, value):
        family = GaugeMetricFamily(name, doc, labels=list(self.labels))
        family.add_metric(list(self.labels.values()), value)
        return family

    def counter(self, name, doc, value):
        family = CounterMetricFamily(name, doc, labels=list(self.labels))
        family.add_metric(list(self.labels.values()), value)
        return family

    def histogram(self, name, doc, snapshot):
        family = HistogramMetricFamily(name, doc, labels=list(self.labels))
        family.add_metric(list(self.labels.values()), _buckets(snapshot), snapshot["sum"])
        return family


def _finished(finished: dict[str, int], vllm: _VllmNames):
    ours = CounterMetricFamily(
        "loraplex_requests_finished", "Finished requests by reason.", labels=["finish_reason"]
    )
    theirs = CounterMetricFamily(
        "vllm:request_success",
        "Finished requests by reason.",
        labels=[*vllm.labels, "finished_reason"],
    )
    for reason, count in finished.items():
        ours.add_metric([reason], count)
        theirs.add_metric([*vllm.labels.values(), reason], count)
    yield ours
    yield theirs


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
        "loraplex_lora_slots_total",
        "Device adapter slots (max_loras, or what the pool holds).",
        lora.get("slots_total", 0),
    )
    yield _gauge(
        "loraplex_lora_waiting_adapters",
        "Adapters that requests wait for.",
        lora.get("adapters_waiting", 0),
    )


def _pool_metrics(pool: dict):
    """The memory pool shared by KV blocks and adapter slots (engine/memory_pool.py)."""
    pages = GaugeMetricFamily(
        "loraplex_pool_pages",
        "Pages of the pool shared by KV blocks and adapter slots, by use (they add up to "
        "loraplex_pool_pages_total).",
        labels=["use"],
    )
    for use, count in pool.get("by_use", {}).items():
        pages.add_metric([use], count)
    yield pages
    yield _gauge("loraplex_pool_pages_total", "Pages of the pool.", pool.get("pages", 0))
    yield _gauge(
        "loraplex_pool_pages_per_slot",
        "Pages one adapter slot takes from the pool.",
        pool.get("pages_per_slot", 0),
    )
    resizes = CounterMetricFamily(
        "loraplex_pool_resizes",
        "Pages passed between KV blocks and adapter slots, by direction.",
        labels=["direction"],
    )
    for direction, count in pool.get("resizes", {}).items():
        resizes.add_metric([direction], count)
    yield resizes
    evictions = CounterMetricFamily(
        "loraplex_pool_evictions",
        "Evictions to make room in the pool, by reason: an idle adapter for KV blocks or for "
        "another adapter, a cached prefix block for an adapter.",
        labels=["reason"],
    )
    for reason, count in pool.get("evictions", {}).items():
        evictions.add_metric([reason], count)
    yield evictions
    yield _counter(
        "loraplex_pool_blocks_moved",
        "KV blocks of running requests moved out of a slot group for an adapter.",
        pool.get("blocks_moved", 0),
    )


# The engine's prefix cache counters, in tokens: stats key -> help (vLLM v1 has the same).
_PREFIX_CACHE_COUNTERS = {
    "prefix_cache_queries": "Prompt tokens looked up in the prefix cache.",
    "prefix_cache_hits": "Prompt tokens found in the prefix cache (not computed again).",
}


def _prefix_cache_metrics(stats: dict, vllm: _VllmNames):
    """Counted in tokens, so hits / queries is the share of prompt tokens not recomputed."""
    for key, doc in _PREFIX_CACHE_COUNTERS.items():
        yield _counter(f"loraplex_{key}", doc, stats.get(key, 0))
        yield vllm.counter(f"vllm:{key}", doc, stats.get(key, 0))
    yield _gauge(
        "loraplex_prefix_cache_blocks",
        "KV cache blocks the prefix cache holds now.",
        stats.get("prefix_cache_blocks", 0),
    )


def _lora_requests_info(lora: dict):
    """The gauge LoRA-aware routers (Gateway API Inference Extension, llm-d) read: the
    adapters of running and waiting requests, by the names clients send as `model` (what
    the router matches a request on), and the device slots."""
    running, waiting = lora.get("running_model_names", []), lora.get("waiting_model_names", [])
    if not adapter_names_shown():
        running, waiting = [], []  # the gauge stays, for routers; the tenants' names go
    info = GaugeMetricFamily(
        "vllm:lora_requests_info",
        "Running and waiting adapters, by the model names clients sent (vLLM-compatible).",
        labels=["running_lora_adapters", "waiting_lora_adapters", "max_lora"],
    )
    info.add_metric(
        [",".join(running), ",".join(waiting), str(lora.get("slots_total", 0))],
        time.time(),  # as vLLM does: routers read the newest sample
    )
    yield info


def _emulated_device_metrics(device: dict):
    """An emulated device's work: busy seconds over elapsed ones is how busy the host keeps it."""
    yield _counter(
        "loraplex_emulated_device_busy_seconds",
        "Seconds the emulated device spent on steps (the cost model's time for each batch).",
        device["busy_seconds"],
    )
    yield _counter(
        "loraplex_emulated_device_steps", "Steps the emulated device ran.", device["steps"]
    )


def _engine_info(info: dict, base_model: str):
    """The device and settings the engine was sized with, as labels of one series (the
    admin's Engines page plans capacity from them)."""
    labels = {"base_model": base_model or "", **{k: str(v) for k, v in info.items()}}
    family = GaugeMetricFamily(
        "loraplex_engine_info", "The engine's device and sizing settings.", labels=list(labels)
    )
    family.add_metric(list(labels.values()), 1)
    return family


def adapter_names_shown() -> bool:
    """Names tell who the tenants are and what they run: only for scrapers holding the token."""
    return bool(settings.METRICS_TOKEN)


def _gauge(name, doc, value):
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name, doc, value):
    return CounterMetricFamily(name, doc, value=value)


def _histogram(name, doc, snapshot):
    return HistogramMetricFamily(name, doc, buckets=_buckets(snapshot), sum_value=snapshot["sum"])


def _buckets(snapshot) -> list[tuple[str, int]]:
    return [
        ("+Inf" if bound == float("inf") else repr(float(bound)), count)
        for bound, count in snapshot["buckets"]
    ]


def render() -> bytes:
    return generate_latest(REGISTRY)
