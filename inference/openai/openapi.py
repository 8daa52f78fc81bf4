"""The OpenAI-compatible endpoints' part of the OpenAPI schema (inference/openapi.py).

The request schemas describe what protocol.py accepts: each one's properties are checked
against the parser's field sets and bounds (tests/inference/openai/test_openapi_fields.py),
so the two cannot drift apart.
"""

from typing import Any

from inference.openapi_common import ERROR_SCHEMAS, KEY_OR_SESSION
from inference.openapi_common import errors as _errors
from inference.openapi_common import ref as _ref

from .prompts import MAX_PROMPTS
from .protocol import (
    MAX_CHOICES,
    MAX_COUNT,
    MAX_ENGINE_REQUESTS,
    MAX_SEED,
    MAX_STOP_SEQUENCES,
    MAX_TOP_LOGPROBS,
)
from .sampling_options import (
    MAX_BIAS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_PENALTY,
    MAX_REPETITION_PENALTY,
    MAX_STOP_TOKEN_IDS,
)
from .tools import MAX_TOOLS

OPENAI_TAG = "OpenAI-compatible"


_NAME_PATTERN = "^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for schema and function names
_SAMPLING = {
    "model": {
        "type": "string",
        "minLength": 1,
        "description": "The base model's name, `adapter`, `adapter@alias` or `adapter:n`.",
    },
    "stream": {"type": "boolean", "default": False},
    "stream_options": {
        "type": "object",
        "properties": {
            "include_usage": {"type": "boolean"},
            "continuous_usage_stats": {
                "type": "boolean",
                "description": "vLLM's: every token chunk carries the usage so far.",
            },
        },
        "additionalProperties": False,
    },
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1},
    "top_k": {
        "type": "integer",
        "minimum": -1,
        "maximum": MAX_COUNT,
        "not": {"enum": [0]},
        "description": "-1 (off) or a positive integer.",
    },
    "seed": {
        "type": "integer",
        "minimum": 0,
        "maximum": MAX_SEED,
        "description": "Choice i samples with `seed + i`, so with `n` choices `seed` may be at "
        "most 2**63 - n.",
    },
    "stop": {
        "oneOf": [
            {"type": "string", "minLength": 1},
            {
                "type": "array",
                "items": {"type": "string", "minLength": 1},
                "maxItems": MAX_STOP_SEQUENCES,
            },
        ]
    },
    "ignore_eos": {"type": "boolean", "default": False},
    "presence_penalty": {
        "type": "number",
        "minimum": -MAX_PENALTY,
        "maximum": MAX_PENALTY,
        "default": 0,
        "nullable": True,
        "description": "Subtracted from the logit of every token already in the completion.",
    },
    "frequency_penalty": {
        "type": "number",
        "minimum": -MAX_PENALTY,
        "maximum": MAX_PENALTY,
        "default": 0,
        "nullable": True,
        "description": "Subtracted from a token's logit once per time it is in the completion.",
    },
    "logit_bias": {
        "type": "object",
        "nullable": True,
        "maxProperties": MAX_LOGIT_BIAS_ENTRIES,
        "additionalProperties": {"type": "number", "minimum": -MAX_BIAS, "maximum": MAX_BIAS},
        "description": "Token id (as a string) to a bias added to its logit; an id outside "
        "the model's vocabulary is a 400. A structured output's grammar still forbids what "
        "it forbids.",
    },
    "repetition_penalty": {
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": MAX_REPETITION_PENALTY,
        "default": 1,
        "nullable": True,
        "description": "vLLM's extension: divides the positive logits (multiplies the negative "
        "ones) of tokens in the prompt or the completion; 1 is none.",
    },
    "min_p": {
        "type": "number",
        "minimum": 0,
        "maximum": 1,
        "default": 0,
        "nullable": True,
        "description": "vLLM's extension: drops tokens less likely than `min_p` times the most "
        "likely one (after temperature).",
    },
    "min_tokens": {
        "type": "integer",
        "minimum": 0,
        "maximum": MAX_COUNT,
        "default": 0,
        "nullable": True,
        "description": "vLLM's extension: end-of-sequence, `stop_token_ids` and `stop` strings "
        "wait until this many tokens; at most `max_tokens`.",
    },
    "stop_token_ids": {
        "type": "array",
        "nullable": True,
        "items": {"type": "integer", "minimum": 0},
        "maxItems": MAX_STOP_TOKEN_IDS,
        "description": "vLLM's extension: token ids that end the answer (finish_reason `stop`).",
    },
    "skip_special_tokens": {
        "type": "boolean",
        "default": True,
        "nullable": True,
        "description": "vLLM's extension: false writes special tokens into the text.",
    },
    "include_stop_str_in_output": {
        "type": "boolean",
        "default": False,
        "nullable": True,
        "description": "vLLM's extension: the stop string (or stop token's text) stays at the "
        "end of the text.",
    },
    "n": {
        "type": "integer",
        "minimum": 1,
        "maximum": MAX_CHOICES,
        "default": 1,
        "nullable": True,
        "description": "How many choices to generate for the prompt, each an engine request of "
        "its own on the same prompt; usage counts the prompt once and the "
        "completion tokens of every choice. The tokens reserved against the tenant's budget "
        "are `n` times the prompt and `max_tokens` (every choice reads its prompt).",
    },
    "prompt_logprobs": {
        "type": "integer",
        "minimum": 0,
        "maximum": MAX_TOP_LOGPROBS,
        "nullable": True,
        "description": "vLLM's extension: the logprob of every prompt token after the first "
        "(with its rank), plus the `prompt_logprobs` most likely tokens at each position. Not "
        "with `stream`.",
    },
    "user": {"type": "string"},
    "response_format": {
        "nullable": True,
        "description": "`text` (no effect), `json_object` (any JSON object) or `json_schema` "
        "(JSON valid against `schema`; `strict` is accepted either way). A schema feature the "
        "grammar engine cannot enforce is a 400 naming it.",
        "oneOf": [
            {
                "type": "object",
                "required": ["type"],
                "properties": {"type": {"type": "string", "enum": ["text", "json_object"]}},
                "additionalProperties": False,
            },
            {
                "type": "object",
                "required": ["type", "json_schema"],
                "properties": {
                    "type": {"type": "string", "enum": ["json_schema"]},
                    "json_schema": {
                        "type": "object",
                        "required": ["name", "schema"],
                        "properties": {
                            "name": {"type": "string", "pattern": _NAME_PATTERN},
                            "schema": {"type": "object"},
                            "strict": {"type": "boolean", "nullable": True},
                            "description": {"type": "string"},
                        },
                        "additionalProperties": False,
                    },
                },
                "additionalProperties": False,
            },
        ],
    },
}
_TOKEN_IDS = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0},
    "minItems": 1,
    "description": "Token ids.",
}
_MAX_TOKENS_BOUNDS = (
    "At most the deployment's cap (LORAPLEX_MAX_TOKENS_CAP, when set; more is a 400) and what "
    "the prompt leaves of the context."
)
_MAX_TOKENS = {
    "type": "integer",
    "minimum": 1,
    "maximum": MAX_COUNT,
    "nullable": True,
    "description": _MAX_TOKENS_BOUNDS,
}
_CHAT_MAX_TOKENS = {
    **_MAX_TOKENS,
    "description": "Unset or null: the deployment's default (LORAPLEX_DEFAULT_MAX_TOKENS), "
    "within the cap and the context. " + _MAX_TOKENS_BOUNDS,
}


def _function_entry(function: dict, required: list[str], **extra: dict) -> dict:
    """OpenAI's `{"type": "function", "function": {...}}` wrapper (a tool, a tool call, a
    named tool_choice), closed to other fields."""
    return {
        "type": "object",
        "required": [*extra, "type", "function"],
        "properties": {
            **extra,
            "type": {"type": "string", "enum": ["function"]},
            "function": {
                "type": "object",
                "required": required,
                "properties": function,
                "additionalProperties": False,
            },
        },
        "additionalProperties": False,
    }


def _excludes(option: str, switch: str) -> dict:
    """`option` (when set) never with `switch: true`."""
    return {
        "anyOf": [
            {"not": {"required": [switch]}},
            {"properties": {switch: {"enum": [False]}}},
            {"not": {"required": [option]}},
            {"properties": {option: {"enum": [None]}}},
        ]
    }


def _needs(option: str, switch: str) -> dict:
    """`option` only with `switch: true` (OpenAPI 3.0 has no if/then: one of the two holds)."""
    return {
        "anyOf": [
            {"required": [switch], "properties": {switch: {"enum": [True]}}},
            {"not": {"required": [option]}},
        ]
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    **ERROR_SCHEMAS,
    "TextPart": {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
    },
    "ChatMessage": {
        "type": "object",
        "required": ["role"],
        "description": "`content` is required except in an assistant's message with "
        "`tool_calls`; a `tool` message answers a call of the assistant message just before it.",
        "properties": {
            "role": {
                "type": "string",
                "enum": ["system", "developer", "user", "assistant", "tool"],
            },
            "content": {
                "description": "Not blank, except in an assistant's message.",
                "nullable": True,
                "oneOf": [
                    {"type": "string", "pattern": "\\S"},
                    {"type": "array", "items": _ref("TextPart"), "minItems": 1},
                ],
            },
            "name": {"type": "string"},
            "refusal": {"type": "string", "nullable": True, "description": "Assistant only."},
            "tool_calls": {
                "type": "array",
                "items": _ref("ToolCall"),
                "description": "Assistant only: the calls it made.",
            },
            "tool_call_id": {"type": "string", "description": "Tool only: the call answered."},
        },
        "additionalProperties": False,
    },
    "ToolCall": _function_entry(
        {
            "name": {"type": "string"},
            "arguments": {"type": "string", "description": "A JSON object, as text."},
        },
        ["name", "arguments"],
        id={"type": "string", "minLength": 1},
    ),
    "Tool": _function_entry(
        {
            "name": {"type": "string", "pattern": _NAME_PATTERN},
            "description": {"type": "string"},
            "parameters": {"type": "object", "description": 'A JSON Schema with "type": "object".'},
            "strict": {"type": "boolean", "nullable": True},
        },
        ["name"],
    ),
    "ChatCompletionRequest": {
        "type": "object",
        "required": ["model", "messages"],
        "additionalProperties": False,  # an unknown parameter is a 400 naming it
        "allOf": [
            _needs("stream_options", "stream"),
            _needs("top_logprobs", "logprobs"),
            _excludes("prompt_logprobs", "stream"),
        ],
        "properties": {
            **_SAMPLING,
            "messages": {"type": "array", "items": _ref("ChatMessage"), "minItems": 1},
            "max_tokens": _CHAT_MAX_TOKENS,
            "max_completion_tokens": _CHAT_MAX_TOKENS,
            "logprobs": {"type": "boolean"},
            "top_logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
            "tools": {
                "type": "array",
                "items": _ref("Tool"),
                "maxItems": MAX_TOOLS,
                "description": "Function tools, for a base model whose chat template shows "
                "tools (else a 400, unless `tool_choice` is `none`). Names are unique.",
            },
            "tool_choice": {
                "description": "`auto` (the default with tools: calls are read from the "
                "answer), `none` (tools not shown), `required` (one or more calls, arguments "
                "held to each tool's `parameters`) or one named function.",
                "oneOf": [
                    {"type": "string", "enum": ["none", "auto", "required"]},
                    _function_entry({"name": {"type": "string"}}, ["name"]),
                ],
            },
            "parallel_tool_calls": {
                "type": "boolean",
                "description": "false: at most one call per answer.",
            },
        },
    },
    "CompletionRequest": {
        "type": "object",
        "required": ["model", "prompt"],
        "additionalProperties": False,
        "allOf": [_needs("stream_options", "stream"), _excludes("prompt_logprobs", "stream")],
        "properties": {
            **_SAMPLING,
            "prompt": {
                "description": "A text, token ids, or a batch of either: each prompt of a "
                f"batch gets `n` choices, prompt p's choice j at index p * n + j. At most "
                f"{MAX_PROMPTS} prompts, and {MAX_ENGINE_REQUESTS} prompts times `best_of` "
                "(or `n`).",
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    _TOKEN_IDS,
                    {
                        "type": "array",
                        "items": {"type": "string", "minLength": 1},
                        "minItems": 1,
                        "maxItems": MAX_PROMPTS,
                    },
                    {
                        "type": "array",
                        "items": _TOKEN_IDS,
                        "minItems": 1,
                        "maxItems": MAX_PROMPTS,
                    },
                ],
            },
            "max_tokens": {
                **_MAX_TOKENS,
                "minimum": 0,
                "default": 16,
                "description": "Unset: 16, as OpenAI's; null: the deployment's default "
                "(LORAPLEX_DEFAULT_MAX_TOKENS); 0 only with `echo` (the prompt alone). "
                + _MAX_TOKENS_BOUNDS,
            },
            "logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
            "echo": {
                "type": "boolean",
                "default": False,
                "nullable": True,
                "description": "Each choice's text begins with its prompt; with `logprobs`, so "
                "do its logprobs (the first prompt token's `token_logprobs` and `top_logprobs` "
                "entries are null: it has no context).",
            },
            "best_of": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_CHOICES,
                "nullable": True,
                "description": "Candidates generated per prompt, of which the `n` with the "
                "highest cumulative logprob are returned; at least `n`, and not above `n` "
                "with `stream`. Usage counts every candidate's tokens.",
            },
        },
    },
    "Usage": {
        "type": "object",
        "properties": {
            "prompt_tokens": {"type": "integer"},
            "completion_tokens": {"type": "integer"},
            "total_tokens": {"type": "integer"},
        },
    },
    "PromptLogprobs": {
        "type": "array",
        "description": "vLLM's shape: one entry per prompt token, null for the first (it has "
        "no context), else the prompt token and the most likely tokens there, keyed by token "
        "id.",
        "items": {
            "type": "object",
            "nullable": True,
            "additionalProperties": {
                "type": "object",
                "required": ["logprob", "rank", "decoded_token"],
                "properties": {
                    "logprob": {"type": "number", "description": "-9999.0 for minus infinity"},
                    "rank": {"type": "integer", "minimum": 1, "nullable": True},
                    "decoded_token": {"type": "string"},
                },
            },
        },
    },
    "Completion": {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string", "enum": ["chat.completion", "text_completion"]},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {
                "type": "array",
                "description": "`n` choices, `index` 0 to n - 1.",
                "items": {
                    "type": "object",
                    "required": ["index", "finish_reason"],
                    "properties": {
                        "index": {"type": "integer", "minimum": 0},
                        "message": {"type": "object", "description": "Chat."},
                        "text": {"type": "string", "description": "Completions."},
                        "logprobs": {"type": "object", "nullable": True},
                        "finish_reason": {"type": "string", "nullable": True},
                        "prompt_logprobs": {
                            "allOf": [_ref("PromptLogprobs")],
                            "description": "Completions, with `prompt_logprobs`.",
                        },
                    },
                },
            },
            "usage": _ref("Usage"),
            "prompt_logprobs": {
                "allOf": [_ref("PromptLogprobs")],
                "description": "Chat, with `prompt_logprobs` (the same for every choice).",
            },
        },
    },
    "Model": {
        "type": "object",
        "required": ["id", "object", "created", "owned_by"],
        "properties": {
            "id": {"type": "string", "description": "What `model` names in a request."},
            "object": {"type": "string", "enum": ["model"]},
            "created": {"type": "integer"},
            "owned_by": {"type": "string", "description": "`loraplex`, or the tenant's slug."},
            "root": {"type": "string", "description": "The base model."},
            "parent": {
                "type": "string",
                "nullable": True,
                "description": "An adapter's base model; null for the base model itself.",
            },
            "max_model_len": {
                "type": "integer",
                "nullable": True,
                "description": "vLLM's: prompt plus completion tokens the engine serving this "
                "model's base holds; null for a base this replica does not serve.",
            },
        },
    },
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"type": "string", "enum": ["list"]},
            "data": {"type": "array", "items": _ref("Model")},
        },
    },
}


def _generation(summary: str, request_schema: str, operation_id: str) -> dict:
    return {
        "post": {
            "operationId": operation_id,
            "summary": summary,
            "tags": [OPENAI_TAG],
            "security": KEY_OR_SESSION,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref(request_schema)}},
            },
            "responses": {
                "200": {
                    "description": "The answer; with `stream`, server-sent events ending "
                    "`data: [DONE]`.",
                    "content": {
                        "application/json": {"schema": _ref("Completion")},
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                **_errors(400, 401, 403, 404, 405, 409, 413, 429, 503),
            },
        }
    }


PATHS: dict[str, dict] = {
    "/v1/chat/completions": _generation(
        "Chat completion through the base model's chat template",
        "ChatCompletionRequest",
        "chat_completions",
    ),
    "/v1/completions": _generation(
        "Completion of a plain prompt (text or token ids), or of a batch of them",
        "CompletionRequest",
        "completions",
    ),
    "/v1/models": {
        "get": {
            "operationId": "models",
            "summary": "The base model, the caller's adapters and their aliases",
            "tags": [OPENAI_TAG],
            "security": KEY_OR_SESSION,
            "responses": {
                "200": {
                    "description": "The models this caller may name.",
                    "content": {"application/json": {"schema": _ref("ModelList")}},
                },
                **_errors(401, 403, 405),
            },
        }
    },
    "/v1/models/{model}": {
        "get": {
            "operationId": "model",
            "summary": "One of the models GET /v1/models lists",
            "tags": [OPENAI_TAG],
            "security": KEY_OR_SESSION,
            "parameters": [
                {
                    "name": "model",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string"},
                    "description": "A model's `id`: the base model, `adapter` or `adapter@alias`.",
                }
            ],
            "responses": {
                "200": {
                    "description": "The model.",
                    "content": {"application/json": {"schema": _ref("Model")}},
                },
                **_errors(401, 403, 404, 405),
            },
        }
    },
}
