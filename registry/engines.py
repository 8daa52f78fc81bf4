"""Talking to the engine processes from the control plane, for operators.

Each `serve` process that hosts an engine answers the operator protocol
(platform_site/operator_protocol.py): pin and unpin by qualified model name
(registry/model_names.py), list the loaded adapters, /metrics, and score an eval set for the
quality gate. Engines are listed in LORAPLEX_ENGINE_URLS and reached with the operator token
(/metrics with the metrics token). Replicas behind a router are listed by one name that
resolves to each of them: `dns+http://engine:8000` (Thanos's and Prometheus's convention)
stands for one URL per address `engine` resolves to, so pins and the Engines page reach
every replica however many compose or Kubernetes runs.
"""

from __future__ import annotations

import json
import math
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from platform_site import operator_protocol as protocol

TIMEOUT_SECONDS = 30  # pinning may wait for the adapter to load
# Scoring a whole eval set twice (adapter and base) at background priority, behind tenants'.
SCORE_TIMEOUT_SECONDS = 900
# The embedded default (`make run`): no LORAPLEX_ENGINE_URLS, the engine runs in `serve`.
EMBEDDED_ENGINE_URL = "http://127.0.0.1:8000"


class EngineCallFailed(Exception):
    def __init__(self, engine: str, message: str, *, status: int | None = None):
        super().__init__(f"{engine}: {message}")
        self.engine = engine
        self.message = message
        self.status = status  # the engine's HTTP status; None when it did not answer


DNS_PREFIX = "dns+"


def engine_urls() -> list[str]:
    """LORAPLEX_ENGINE_URLS, each `dns+` entry expanded to its replicas' addresses now."""
    urls: list[str] = []
    for url in settings.ENGINE_URLS:
        expanded = _resolve(url.removeprefix(DNS_PREFIX)) if url.startswith(DNS_PREFIX) else [url]
        urls += [u for u in expanded if u not in urls]
    return urls


def _resolve(url: str) -> list[str]:
    """One URL per IPv4/IPv6 address of the URL's host; none while the name does not resolve
    (no replica is up): the caller reports an empty list, not an error."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None:
        return [url]
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    urls = []
    for family, _, _, _, address in sorted(infos, key=lambda info: info[0] != socket.AF_INET):
        host = address[0] if family == socket.AF_INET else f"[{address[0]}]"
        urls.append(urllib.parse.urlunsplit(parts._replace(netloc=f"{host}:{port}")))
    return list(dict.fromkeys(urls))


def _call(
    engine: str,
    method: str,
    path: str,
    body: dict | None = None,
    *,
    timeout: float = TIMEOUT_SECONDS,
) -> bytes:
    headers = {"Accept": "application/json"}
    token = settings.METRICS_TOKEN if path == protocol.METRICS_PATH else settings.OPERATOR_TOKEN
    if token:
        headers.update(protocol.authorization(token))
    data = None
    if body is not None:
        data = _encode(body)
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(engine + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        message = f"HTTP {exc.code}: {_error_message(exc)}"
        raise EngineCallFailed(engine, message, status=exc.code) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EngineCallFailed(engine, f"unreachable ({reason})") from None


def _error_message(exc: urllib.error.HTTPError) -> str:
    """The OpenAI-shaped `{"error": {"message"}}` the engine answers, else the raw text."""
    raw = exc.read()[:2000].decode(errors="replace")
    try:
        return json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return raw.strip() or exc.reason


@dataclass(frozen=True)
class PinResult:
    engine: str
    ok: bool
    message: str


def set_pinned(lora_name: str, *, pinned: bool) -> list[PinResult]:
    """Pin (or unpin) one adapter on every configured engine; one result per engine."""
    action = protocol.PIN if pinned else protocol.UNPIN
    results = []
    for engine in engine_urls():
        try:
            _call(engine, "POST", protocol.path(action), {protocol.LORA_NAME: lora_name})
        except EngineCallFailed as exc:
            results.append(PinResult(engine, False, exc.message))
        else:
            results.append(PinResult(engine, True, "pinned" if pinned else "unpinned"))
    return results


# 4xx answers that mean "not here, not now", not "never": a timeout, another revision or base
# model served (model_not_servable), too early, too busy.
_NOT_YET_4XX = frozenset({408, 409, 425, 429})
_WRAPPER_BYTES = 1024  # a scoring body's bytes besides its rows


def is_refusal(failure: EngineCallFailed) -> bool:
    """Whether an engine refused the request itself: a row it cannot score, a version it does
    not know, the credentials. Every engine, now or later, would answer the same. Anything else
    is "not yet": no answer (restarting, refusing connections, timed out), a 5xx (503 while
    starting or draining), another revision or base model served (409), too busy (429)."""
    status = failure.status
    return status is not None and 400 <= status < 500 and status not in _NOT_YET_4XX


class ScoringFailed(Exception):
    """No engine scored the rows. `retryable` is False when an engine refused the request itself
    (`is_refusal`): trying again would get the same answer. Otherwise no engine could score it
    yet (unreachable, restarting, not yet on the version's base revision): waiting may help;
    `failures` says what each one answered."""

    def __init__(self, message: str, failures: list[EngineCallFailed], *, retryable: bool):
        detail = "; ".join(str(f) for f in failures)
        super().__init__(f"{message}: {detail}" if detail else message)
        self.failures = failures
        self.retryable = retryable
        self.summary = message

    @property
    def without_engines(self) -> str:
        """What went wrong, without the engines' addresses (for tenants' eyes)."""
        answers = list(dict.fromkeys(f.message for f in self.failures))
        return f"{self.summary}: {'; '.join(answers)}" if answers else self.summary


def score_on_engine(
    version_uid, rows: list[dict], *, timeout: float = SCORE_TIMEOUT_SECONDS
) -> dict:
    """Score eval rows (`{"messages"|"prompt", "completion"}`) under a version (its uid; None
    for the base model alone) and under the base model, on the first engine that answers
    (LORAPLEX_ENGINE_URLS in order, else the embedded default's `serve`). Returns the engine's
    answer (inference/operator/scoring.py): `base_revision`, per row `tokens`, `adapter_nll`,
    `base_nll`, and the `adapter` and `base` totals. Rows go in as few requests as the
    engines' limits allow (LORAPLEX_MAX_REQUEST_BYTES, LORAPLEX_EVAL_MAX_ROWS), their answers
    merged into one. Raises ScoringFailed; `timeout` bounds the wait for each answer."""
    uid = None if version_uid is None else str(version_uid)
    answers = [_score_batch(uid, batch, timeout) for batch in _batches(list(rows))]
    return answers[0] if len(answers) == 1 else merge_answers(answers)


def _encode(body) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _batches(rows: list[dict]) -> list[list[dict]]:
    """Consecutive rows, as many to a request as fit the body and row limits (a row too big
    for any request goes alone, for the engine to refuse)."""
    room = settings.MAX_REQUEST_BYTES - _WRAPPER_BYTES
    most = getattr(settings, "EVAL_MAX_ROWS", 200)
    batches: list[list[dict]] = [[]]
    size = 0
    for row in rows:
        row_size = len(_encode(row)) + 1  # and its comma
        if batches[-1] and (size + row_size > room or len(batches[-1]) >= most):
            batches.append([])
            size = 0
        batches[-1].append(row)
        size += row_size
    return batches


def _score_batch(uid: str | None, rows: list[dict], timeout: float) -> dict:
    body = {protocol.ADAPTER_VERSION: uid, protocol.ROWS: rows}
    failures = []
    for engine in _scoring_engines():
        try:
            raw = _call(engine, "POST", protocol.path(protocol.SCORE), body, timeout=timeout)
        except EngineCallFailed as exc:
            if is_refusal(exc):
                refused = ScoringFailed("the engine refused the eval set", [exc], retryable=False)
                raise refused from None
            failures.append(exc)
            continue
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if isinstance(answer, dict) and isinstance(answer.get(protocol.ROWS), list):
            return answer
        failures.append(EngineCallFailed(engine, "the answer is not the expected JSON object"))
    raise ScoringFailed("no engine scored the eval set", failures, retryable=True)


def _scoring_engines() -> list[str]:
    """The engines to try. The embedded default only when none is configured: a `dns+` name
    that resolves to nothing means every replica is down (restarting), not "try localhost"."""
    if not settings.ENGINE_URLS:
        return [EMBEDDED_ENGINE_URL]
    urls = engine_urls()
    if not urls:
        raise ScoringFailed(
            "no engine is up: LORAPLEX_ENGINE_URLS resolves to no address", [], retryable=True
        )
    return urls


def merge_answers(answers: list[dict]) -> dict:
    """One answer for several requests' rows, in order, with the totals over all of them."""
    if len({answer["base_revision"] for answer in answers}) > 1:
        raise ScoringFailed("the base model's revision changed while scoring", [], retryable=True)
    merged = {**answers[0], protocol.ROWS: [row for a in answers for row in a[protocol.ROWS]]}
    for part in ("adapter", "base"):
        if merged.get(part) is None:
            continue
        tokens = sum(answer[part]["tokens"] for answer in answers)
        nll = sum(answer[part]["nll"] * answer[part]["tokens"] for answer in answers) / tokens
        perplexity = math.exp(nll) if nll < math.log(sys.float_info.max) else sys.float_info.max
        merged[part] = {"tokens": tokens, "nll": nll, "perplexity": perplexity}
    return merged


@dataclass
class EngineState:
    """What the engines page shows for one engine; `error` says why a part is missing."""

    url: str
    adapters_by_tier: dict[str, list[dict]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    hit_rates: dict[str, dict] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    # the device and settings it was sized with (loraplex_engine_info's labels)
    info: dict[str, str] = field(default_factory=dict)
    # the memory pool: pages by use, resizes by direction, evictions by reason
    pool: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def prefix_cache(self) -> dict[str, float | None]:
        """Prompt tokens looked up in the engine's prefix cache, those found, the hit rate
        (None before any lookup) and the blocks it holds now."""
        queries = self.metrics.get("loraplex_prefix_cache_queries_total", 0.0)
        hits = self.metrics.get("loraplex_prefix_cache_hits_total", 0.0)
        return {
            "queries": queries,
            "hits": hits,
            "rate": hits / queries if queries else None,
            "blocks": self.metrics.get("loraplex_prefix_cache_blocks", 0.0),
        }

    @property
    def tiers(self) -> list[tuple[str, list[dict]]]:
        """Fastest tier first: device slots, host memory, local disk, then anything else."""
        order = ("device", "gpu", "host", "cpu", "disk", "object_storage")
        return sorted(
            self.adapters_by_tier.items(),
            key=lambda item: (order.index(item[0]) if item[0] in order else len(order), item[0]),
        )


def parse_engine_info(text: str) -> dict[str, str]:
    """The labels of loraplex_engine_info: the engine's device and sizing settings."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "loraplex_engine_info":
                return dict(sample.labels)
    return {}


# labelled pool samples -> (the EngineState.pool key, the label that names the row)
POOL_SAMPLES = {
    "loraplex_pool_pages": ("pages", "use"),
    "loraplex_pool_resizes_total": ("resizes", "direction"),
    "loraplex_pool_evictions_total": ("evictions", "reason"),
}


def parse_pool(text: str) -> dict[str, dict[str, float]]:
    """The memory pool's labelled samples: pages by use (running KV, cached prefixes,
    adapters in use, idle adapters, free), resizes by direction, evictions by reason."""
    pool: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in POOL_SAMPLES:
                key, label = POOL_SAMPLES[sample.name]
                pool.setdefault(key, {})[sample.labels.get(label, "?")] = sample.value
    return pool


def parse_metrics(text: str) -> tuple[dict[str, float], dict[str, dict]]:
    """Unlabelled samples by name, and per-tier adapter lookups, hits and hit rate."""
    plain: dict[str, float] = {}
    tiers: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("loraplex_lora_lookups_total", "loraplex_lora_hits_total"):
                kind = "lookups" if "lookups" in sample.name else "hits"
                tiers.setdefault(sample.labels.get("tier", "?"), {})[kind] = sample.value
            elif not sample.labels:
                plain[sample.name] = sample.value
    for counts in tiers.values():
        lookups, hits = counts.get("lookups", 0), counts.get("hits", 0)
        counts["rate"] = hits / lookups if lookups else None
    return plain, tiers


def engine_state(engine: str) -> EngineState:
    state = EngineState(url=engine)
    try:
        listing = json.loads(_call(engine, "GET", protocol.path(protocol.LIST)))
        items = listing.get("data", []) if isinstance(listing, dict) else listing
        names = (protocol.LORA_NAME, "name", "id")  # vLLM's listing, ours, OpenAI's models
        for item in items:
            name = next((item[k] for k in names if item.get(k)), "?")
            row = {"name": name, **{k: v for k, v in item.items() if k not in names}}
            state.adapters_by_tier.setdefault(str(item.get("tier", "unknown")), []).append(row)
    except EngineCallFailed as exc:
        state.errors.append(f"adapters: {exc.message}")
    except (ValueError, AttributeError) as exc:
        state.errors.append(f"adapters: the answer is not the expected JSON list ({exc})")
    try:
        text = _call(engine, "GET", protocol.METRICS_PATH).decode(errors="replace")
        state.metrics, state.hit_rates = parse_metrics(text)
        state.info = parse_engine_info(text)
        state.pool = parse_pool(text)
    except EngineCallFailed as exc:
        state.errors.append(f"metrics: {exc.message}")
    except ValueError as exc:
        state.errors.append(f"metrics: not Prometheus text ({exc})")
    return state
