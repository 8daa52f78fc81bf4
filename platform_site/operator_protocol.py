"""The operator protocol: the paths and fields the control plane's client (registry/engines.py)
and each engine's operator endpoints (inference/operator/) agree on. Constants only.

Here, below both, so that the registry reaches engines without importing the serving layer.
The endpoints themselves (vLLM's adapter calls, the listing, the quality gate's scoring) are
described in the OpenAPI schema (inference/operator/openapi.py).
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

# The quality gate's scoring call (inference/operator/scoring.py): POST {"adapter_version":
# "<version uid>" | null, "rows": [...]}, answered with each row's and the totals' negative
# log-likelihood.
SCORE = "internal/score"
ADAPTER_VERSION = "adapter_version"
ROWS = "rows"


def path(action: str) -> str:
    """`pin_lora_adapter` -> `/v1/pin_lora_adapter`, the path an engine answers it on."""
    return PREFIX + action


def authorization(token: str) -> dict[str, str]:
    """The header the control plane sends; the engine reads it with tenants.keyauth.bearer_token."""
    return {"Authorization": f"Bearer {token}"}
