"""Errors a caller of the engine can cause.

Every class is a ValueError so a serving layer can map all of them to a 4xx
answer, and every message says what to change. Anything else the engine raises
is a bug or a broken machine, not the caller's fault.
"""


class EngineError(ValueError):
    """Base class for errors caused by the engine's input (config, model, request)."""


class ConfigError(EngineError):
    """An EngineConfig value is out of range or inconsistent with the model."""


class ModelLoadError(EngineError):
    """The model folder is missing, corrupt, incomplete or of an unsupported kind."""


class InvalidRequestError(EngineError):
    """A request cannot be served as given (empty prompt, bad token ids, ...)."""


class PromptTooLongError(InvalidRequestError):
    """The prompt does not fit the model's context or the whole KV cache."""


class SamplingParamsError(InvalidRequestError):
    """A sampling value is out of range."""


class UnsupportedSchemaError(InvalidRequestError):
    """A structured output's JSON schema cannot be enforced: it is not a valid schema, or it
    uses features the grammar engine lacks. The message names them."""


class StructuredOutputUnavailableError(InvalidRequestError):
    """A structured output was asked of an engine without a grammar engine (the llguidance
    package is not installed); unconstrained requests still run."""


class DuplicateRequestError(InvalidRequestError):
    """A request id is already in use by an unfinished request."""


class AdapterLoadError(EngineError):
    """A LoRA adapter could not be loaded (missing, refused by the PEFT rules, or the loader
    failed). Only the requests for that adapter fail; the message names the failed checks."""


class EngineStoppedError(EngineError):
    """The engine was shut down; no new requests are taken."""


class EngineDeadError(EngineStoppedError):
    """The step loop failed: the requests the engine held fail with this, new ones are
    refused, and only a fresh process serves again. Not the caller's fault."""


class InvalidMessagesError(InvalidRequestError):
    """A conversation the chat template cannot be given; `param` names the field at fault
    (`messages[2].content`), so a serving layer can point the caller at it."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.param = param
