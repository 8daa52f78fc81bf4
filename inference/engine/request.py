"""What a caller sends: one request, and the adapter it runs with.

Plain values; `LLMEngine.make_sequence` validates a request against the engine (types, the
vocabulary, the context length) and turns it into a Sequence.
"""

import os
from dataclasses import KW_ONLY, dataclass
from enum import IntEnum

from .errors import InvalidRequestError
from .sampling_params import SamplingParams


class Priority(IntEnum):
    """Lower runs first; any integer works. Tenants' traffic runs at DEFAULT, the platform's
    own work (quality-gate scoring, warm-up) at BACKGROUND, behind it."""

    DEFAULT = 0
    BACKGROUND = 10


@dataclass(frozen=True)
class LoRARequest:
    """Which adapter a request runs with. `adapter_id` is the identity: one id, one set of
    weights, never changed (the registry passes its AdapterVersion's uid, and versions are
    immutable). `name` is for people and metrics; `path` is a local folder with the PEFT
    files, or None to ask the engine's loader callback for one."""

    name: str
    adapter_id: str
    path: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        for field in ("name", "adapter_id"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise InvalidRequestError(
                    f"LoRARequest.{field} must be a non-empty string, got {value!r}"
                )
        if self.path is not None and not isinstance(self.path, str | os.PathLike):
            raise InvalidRequestError(
                f"LoRARequest.path must be a folder path or None, got {type(self.path).__name__}"
            )


@dataclass(frozen=True)
class EngineRequest:
    """One generation request: exactly one of `prompt` (text) and `prompt_token_ids`, the
    sampling settings (default SamplingParams()), the adapter (None: the base model), the
    fairness key the scheduler takes turns between (a tenant), and when it arrived (default:
    when the engine takes it), and its priority (lower first: a waiting request of a lower
    value is admitted before, and may preempt, running ones of a higher value). `model_name`
    is the name the client asked for (an alias, say), which routers match on in the metrics
    (default: the adapter's name). Written `EngineRequest("r1", "Hello", params)` for text."""

    request_id: str
    prompt: str | None = None
    sampling_params: SamplingParams | None = None
    _: KW_ONLY
    prompt_token_ids: list[int] | None = None
    lora_request: LoRARequest | None = None
    fairness_key: str | None = None
    arrival_time: float | None = None
    priority: int = Priority.DEFAULT
    model_name: str | None = None
