"""Why the serving layer refuses a request: one ApiError class per code, and how the
engine's own, Django-free refusals (inference/engine/errors.py) answer.

Raised where the input enters (parsing, limits, model resolution, the engine host) and
answered by the views' json_endpoint through platform_site/error_responses.py.
"""

from inference.engine.errors import (
    AdapterLoadError,
    EngineError,
    EngineStoppedError,
    PromptTooLongError,
)
from platform_site.error_translations import Translation
from platform_site.errors import ApiError


class ProtocolError(ApiError, status=400):
    """A request body the OpenAI-compatible API cannot honour; `param` names the field."""


class InvalidJson(ProtocolError, status=400, code="invalid_json"):
    """The body is not a JSON object."""


class UnknownParameter(ProtocolError, status=400, code="unknown_parameter"):
    """A parameter OpenAI's API does not have."""


class UnsupportedParameter(ProtocolError, status=400, code="unsupported_parameter"):
    """An OpenAI parameter this server accepts only at its neutral value."""


class ContextLengthExceeded(ProtocolError, status=400, code="context_length_exceeded"):
    """The prompt, or the prompt plus max_tokens, does not fit the model's context."""


class RateLimited(ApiError, status=429, code="rate_limit_exceeded"):
    """Too many requests for this key this minute; `Retry-After` says when to come back."""

    def __init__(self, message: str, *, retry_after: int):
        super().__init__(message, headers={"Retry-After": str(retry_after)})
        self.retry_after = retry_after


class TokensExceeded(RateLimited, status=429, code="tokens_exceeded"):
    """The tenant used its tokens for this minute."""


class ConcurrencyExceeded(RateLimited, status=429, code="concurrency_exceeded"):
    """The tenant already has its maximum of requests running in this process."""


class TokenizationsExceeded(RateLimited, status=429, code="tokenizations_exceeded"):
    """The tenant already has its maximum of texts being tokenized in this process."""


class ModelNotFound(ApiError, status=404, code="model_not_found"):
    """The same answer whether the model does not exist or belongs to another tenant."""

    def __init__(self, name: str, *, param: str | None = None):
        message = f"The model '{name}' does not exist or you do not have access to it."
        super().__init__(message, param=param)


class ModelNotServable(ApiError, status=409, code="model_not_servable"):
    """The name resolves, but to a version that may not run here (not ready, incompatible)."""


class BaseModelUnavailable(ApiError, status=503, code="base_model_unavailable"):
    """The model runs on a base model this replica does not serve: the router sends it to
    that base model's replicas, and answers the same code when none of them is ready."""


class EngineUnavailable(ApiError, status=503, code="engine_unavailable"):
    """No engine in this process: turned off, no base model imported, or it failed to start."""


class AdapterUnavailable(ApiError, status=503, code="adapter_unavailable"):
    """The engine could not load the request's adapter, after the request was accepted."""


class OperatorOnly(ApiError, status=403, code="operator_only"):
    """Neither the operator token (LORAPLEX_OPERATOR_TOKEN) nor a staff session with the
    registry.operate_engines permission."""


class MetricsTokenRequired(ApiError, status=401, code="metrics_token_required"):
    """/metrics without `Authorization: Bearer $LORAPLEX_METRICS_TOKEN`, when that is set."""

    def __init__(self, message: str | None = None, **kwargs):
        super().__init__(message, **kwargs)
        self.headers.setdefault("WWW-Authenticate", 'Bearer realm="loraplex"')


# The engine imports nothing from Django, so its refusals become API errors here (registered
# by InferenceConfig); one that names its field (InvalidMessagesError) names it.
ENGINE_ERRORS = {
    PromptTooLongError: Translation(ContextLengthExceeded, param="messages"),
    AdapterLoadError: Translation(AdapterUnavailable),
    EngineStoppedError: Translation(EngineUnavailable),
    EngineError: Translation(ApiError),
}
