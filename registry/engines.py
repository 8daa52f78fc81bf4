"""Talking to the engine processes from the control plane, for operators.

Each `serve` process that hosts an engine answers the operator protocol
(inference/operator_protocol.py): pin and unpin by qualified model name
(registry/model_names.py), list the loaded adapters, and /metrics. Engines are listed in
LORAPLEX_ENGINE_URLS and reached with the operator token (/metrics with the metrics token).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from inference import operator_protocol as protocol

TIMEOUT_SECONDS = 30  # pinning may wait for the adapter to load


class EngineCallFailed(Exception):
    def __init__(self, engine: str, message: str):
        super().__init__(f"{engine}: {message}")
        self.engine = engine
        self.message = message


def engine_urls() -> list[str]:
    return list(settings.ENGINE_URLS)


def _call(engine: str, method: str, path: str, body: dict | None = None) -> bytes:
    headers = {"Accept": "application/json"}
    token = settings.METRICS_TOKEN if path == protocol.METRICS_PATH else settings.OPERATOR_TOKEN
    if token:
        headers.update(protocol.authorization(token))
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(engine + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        raise EngineCallFailed(engine, f"HTTP {exc.code}: {_error_message(exc)}") from None
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


@dataclass
class EngineState:
    """What the engines page shows for one engine; `error` says why a part is missing."""

    url: str
    adapters_by_tier: dict[str, list[dict]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    hit_rates: dict[str, dict] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def tiers(self) -> list[tuple[str, list[dict]]]:
        """Fastest tier first: device slots, host memory, local disk, then anything else."""
        order = ("device", "gpu", "host", "cpu", "disk", "object_storage")
        return sorted(
            self.adapters_by_tier.items(),
            key=lambda item: (order.index(item[0]) if item[0] in order else len(order), item[0]),
        )


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
    except EngineCallFailed as exc:
        state.errors.append(f"metrics: {exc.message}")
    except ValueError as exc:
        state.errors.append(f"metrics: not Prometheus text ({exc})")
    return state
