"""Through a live `manage.py serve` (the tiny model, a real adapter): vLLM's metric names beside
ours after real requests, each the same number under both, labelled with the served base
model as vLLM labels them; and the router gauge naming adapters by the `model` the clients
sent, as a LoRA-aware router matches them."""

from contextlib import ExitStack, contextmanager

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.clients import chat, chat_stream
from tests.inference.conftest import BASE_NAME, start_server, stop_server

METRICS = "metrics-token-for-the-vllm-names-0123456789"
SERVED = {"model_name": BASE_NAME}

# vLLM's name -> ours, for every series a router or dashboard reads (sample names).
SAME_AS_OURS = {
    "vllm:num_requests_running": "loraplex_requests_running",
    "vllm:num_requests_waiting": "loraplex_requests_waiting",
    "vllm:kv_cache_usage_perc": "loraplex_kv_cache_usage_ratio",
    "vllm:gpu_cache_usage_perc": "loraplex_kv_cache_usage_ratio",
    "vllm:prompt_tokens_total": "loraplex_prompt_tokens_total",
    "vllm:generation_tokens_total": "loraplex_generation_tokens_total",
    "vllm:num_preemptions_total": "loraplex_preemptions_total",
    "vllm:prefix_cache_queries_total": "loraplex_prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total": "loraplex_prefix_cache_hits_total",
    **{
        f"vllm:{theirs}_{part}": f"loraplex_{ours}_{part}"
        for theirs, ours in (
            ("time_to_first_token_seconds", "time_to_first_token_seconds"),
            ("inter_token_latency_seconds", "inter_token_latency_seconds"),
            ("time_per_output_token_seconds", "inter_token_latency_seconds"),
            ("e2e_request_latency_seconds", "e2e_request_latency_seconds"),
            ("request_queue_time_seconds", "request_queue_time_seconds"),
        )
        for part in ("count", "sum")
    },
}

# The server reads rows committed by the module's fixtures; tests change them only over HTTP.
pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def server(serve_data):
    """As production runs: the scrape needs the metrics token, and then names adapters."""
    url, proc, _ = start_server(serve_data["tmp"], {"LORAPLEX_METRICS_TOKEN": METRICS})
    yield url
    stop_server(proc)


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of one scrape: (name, sorted labels) -> value."""
    response = httpx.get(
        f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS}"}, timeout=60
    )
    assert response.status_code == 200, response.text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def vllm(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted({**SERVED, **labels}.items())))]


def ours(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_a_request_shows_under_vllms_names_as_under_ours(server, serve_data):
    key = serve_data["keys"][0]
    before = scrape(server)
    answer = chat(server, key, model="pirate", max_tokens=3, temperature=0, ignore_eos=True)
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    after = scrape(server)
    for theirs, mine in SAME_AS_OURS.items():
        assert vllm(after, theirs) == ours(after, mine), theirs
    # one request's tokens, counted once, seen under both names
    for name, tokens in (
        ("vllm:prompt_tokens_total", usage["prompt_tokens"]),
        ("vllm:generation_tokens_total", usage["completion_tokens"]),
    ):
        assert vllm(after, name) - vllm(before, name) == tokens, name
    grew = vllm(after, "vllm:time_to_first_token_seconds_count")
    assert grew == vllm(before, "vllm:time_to_first_token_seconds_count") + 1
    assert vllm(after, "vllm:inter_token_latency_seconds_count") >= 2  # 3 tokens: 2 gaps
    bucket = ("vllm:e2e_request_latency_seconds_bucket", {"le": "+Inf"})
    assert vllm(after, bucket[0], **bucket[1]) == ours(
        after, "loraplex_e2e_request_latency_seconds_bucket", le="+Inf"
    )
    finished = vllm(after, "vllm:request_success_total", finished_reason="length")
    assert finished == ours(after, "loraplex_requests_finished_total", finish_reason="length")
    assert finished >= 1


@contextmanager
def running(url: str, key: str, model: str):
    """A stream on `model`, open (its first tokens read) for the body's duration: as long as
    the tiny model's context allows, so it outlasts the scrape."""
    story = [{"role": "user", "content": "Tell me a long story"}]
    with chat_stream(url, key, model=model, messages=story, max_tokens=480) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        while '"content":""' in (line := next(lines)) or not line:
            pass  # the role chunk first: then tokens, so the request is in the batch
        yield


def lora_gauge(samples: dict) -> dict[str, str]:
    (labels,) = [dict(k[1]) for k in samples if k[0] == "vllm:lora_requests_info"]
    return labels


def test_the_router_gauge_names_the_models_the_clients_sent(server, serve_data):
    key = serve_data["keys"][0]
    with ExitStack() as streams:
        for model in ("pirate@production", "pirate"):  # one adapter, asked for two ways
            streams.enter_context(running(server, key, model))
        gauge = lora_gauge(scrape(server))
    assert gauge == {
        "running_lora_adapters": "pirate,pirate@production",
        "waiting_lora_adapters": "",
        "max_lora": "2",  # LORAPLEX_MAX_LORAS of the live server
    }
    assert "serve-a" not in ",".join(gauge.values())  # no tenant-qualified registry name
