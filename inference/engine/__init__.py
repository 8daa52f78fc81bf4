"""Loraplex's inference engine: one base model, many LoRA adapters, continuous batching.

The front door: import what a caller needs from here (`from inference.engine import
LLMEngine, EngineRequest`). The core loop lives in this folder (config, llm_engine,
async_engine, scheduler, block_manager, kv_cache, memory_pool, sequence, sampler, outputs);
`model/` holds the Llama layers, `lora/` the adapters (device slots, host cache, loader, PEFT
rules) and `formats/` the offline tools (GGUF conversion, safetensors headers). Nothing here
imports Django.

Names load on first use, so `import inference.engine.lora.peft_rules` (the registry's
validator) pulls in neither torch nor the model.
"""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .async_engine import AsyncLLMEngine, RequestStream
    from .config import EngineConfig
    from .errors import (
        AdapterLoadError,
        ConfigError,
        DuplicateRequestError,
        EngineDeadError,
        EngineError,
        EngineStoppedError,
        InvalidRequestError,
        ModelLoadError,
        PromptTooLongError,
        SamplingParamsError,
        StructuredOutputUnavailableError,
        UnsupportedSchemaError,
    )
    from .llm_engine import LLMEngine
    from .logprobs import TokenLogprob
    from .outputs import CompletionOutput, RequestOutput
    from .request import EngineRequest, LoRARequest, Priority
    from .sampling_params import SamplingParams
    from .scoring import ScoreResult
    from .structured_output import StructuredOutput
    from .tokenizer import TokenizerError

__all__ = [
    "AdapterLoadError",
    "AsyncLLMEngine",
    "CompletionOutput",
    "ConfigError",
    "DuplicateRequestError",
    "EngineConfig",
    "EngineDeadError",
    "EngineError",
    "EngineRequest",
    "EngineStoppedError",
    "InvalidRequestError",
    "LLMEngine",
    "LoRARequest",
    "ModelLoadError",
    "Priority",
    "PromptTooLongError",
    "RequestOutput",
    "RequestStream",
    "SamplingParams",
    "SamplingParamsError",
    "ScoreResult",
    "StructuredOutput",
    "StructuredOutputUnavailableError",
    "TokenLogprob",
    "TokenizerError",
    "UnsupportedSchemaError",
]

# module (in this package) -> the public names it defines
_HOMES = {
    "async_engine": ("AsyncLLMEngine", "RequestStream"),
    "config": ("EngineConfig",),
    "errors": (
        "AdapterLoadError",
        "ConfigError",
        "DuplicateRequestError",
        "EngineDeadError",
        "EngineError",
        "EngineStoppedError",
        "InvalidRequestError",
        "ModelLoadError",
        "PromptTooLongError",
        "SamplingParamsError",
        "StructuredOutputUnavailableError",
        "UnsupportedSchemaError",
    ),
    "llm_engine": ("LLMEngine",),
    "logprobs": ("TokenLogprob",),
    "outputs": ("CompletionOutput", "RequestOutput"),
    "request": ("EngineRequest", "LoRARequest", "Priority"),
    "sampling_params": ("SamplingParams",),
    "scoring": ("ScoreResult",),
    "structured_output": ("StructuredOutput",),
    "tokenizer": ("TokenizerError",),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{home}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value
