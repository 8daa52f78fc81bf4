"""The operator protocol: what the control plane (registry/engines.py) and each engine's
operator endpoints (inference/operator.py, inference/urls.py) agree on. Constants only.

Shaped like vLLM's adapter endpoints: POST `{"lora_name": "<tenant>/<adapter>[@alias|:n]"}`
(registry/model_names.py) to load, unload, pin or unpin; load also takes vLLM's `lora_path`
(a folder or `s3://` prefix registered as the adapter's next version, then loaded) and
`load_inplace`; any other field is refused. GET the loaded adapters; GET /metrics; POST an
eval set to score (the quality gate). Engines run in other processes, so
calls carry `Authorization: Bearer $LORAPLEX_OPERATOR_TOKEN`, and /metrics
`$LORAPLEX_METRICS_TOKEN` (a staff session with the `registry.operate_engines` permission
also works when calling an engine directly).
"""

PREFIX = "/v1/"  # where platform_site/urls.py mounts inference/urls.py

LOAD = "load_lora_adapter"  # load and pin: it stays hot until unpinned
UNLOAD = "unload_lora_adapter"
PIN = "pin_lora_adapter"
UNPIN = "unpin_lora_adapter"
LIST = "lora_adapters"  # GET: {"object": "list", "data": [{"name", "tier", "pinned", ...}]}
METRICS_PATH = "/metrics"

LORA_NAME = "lora_name"  # in every POST body, echoed in the answer
# Load only, as vLLM: the files to register as `<tenant>/<adapter>`'s next version and load;
# `load_inplace: true` lets them replace what an adapter that already has a version serves.
LORA_PATH = "lora_path"
LOAD_INPLACE = "load_inplace"
NAME_FIELDS = (LORA_NAME,)
LOAD_FIELDS = (LORA_NAME, LORA_PATH, LOAD_INPLACE)

# The quality gate's scoring call (inference/scoring_api.py): POST {"adapter_version": "<version
# uid>" | null, "rows": [...]}, answered with each row's and the totals' negative log-likelihood.
SCORE = "internal/score"
ADAPTER_VERSION = "adapter_version"
ROWS = "rows"


def path(action: str) -> str:
    """`pin_lora_adapter` -> `/v1/pin_lora_adapter`, the path an engine answers it on."""
    return PREFIX + action


def authorization(token: str) -> dict[str, str]:
    """The header the control plane sends; the engine reads it with tenants.keyauth.bearer_token."""
    return {"Authorization": f"Bearer {token}"}
