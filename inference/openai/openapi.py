"""The OpenAI-compatible `/v1` endpoints in the OpenAPI schema at /api/schema/.

They are plain async Django views (inference/views.py), which drf-spectacular does not see,
so this postprocessing hook (SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]) adds them from
the fragments below: /api/docs/ then shows every API a caller has, and the API fuzz tests
(tests/fuzz/) generate requests for them from the same description. The fragments describe
what inference/openai_protocol.py accepts; a change there belongs here too.
"""

from typing import Any

from . import operator_protocol as protocol
from .openai_protocol import (
    MAX_CHOICES,
    MAX_COUNT,
    MAX_SEED,
    MAX_STOP_SEQUENCES,
    MAX_TOP_LOGPROBS,
)
from .tools import MAX_TOOLS

OPENAI_TAG = "OpenAI-compatible"
OPERATOR_TAG = "Operators"
# The key scheme drf-spectacular derives from tenants/authentication.py, and the session.
KEY_OR_SESSION: list[dict[str, list]] = [{"ApiKey": []}, {"cookieAuth": []}]
OPERATOR_AUTH: list[dict[str, list]] = [{"OperatorToken": []}, {"cookieAuth": []}]

_ERROR_REF = {"$ref": "#/components/schemas/OpenAIError"}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _errors(*statuses: int) -> dict[str, dict]:
    reasons = {
        400: "The body or a parameter is invalid (`param` names it).",
        401: "No valid credentials.",
        403: "The credentials do not allow this.",
        404: "No such model for this tenant (the same answer for another tenant's).",
        405: "Wrong method (`Allow` names the right one).",
        409: "The version cannot be served by this base model.",
        413: "The body is over LORAPLEX_MAX_REQUEST_BYTES.",
        429: "Over a rate limit (`Retry-After` says when to retry).",
        503: "The engine or the adapter is not available now.",
    }
    return {
        str(status): {
            "description": reasons[status],
            "content": {"application/json": {"schema": _ERROR_REF}},
        }
        for status in statuses
    }


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
        "properties": {"include_usage": {"type": "boolean"}},
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
    "n": {
        "type": "integer",
        "minimum": 1,
        "maximum": MAX_CHOICES,
        "default": 1,
        "nullable": True,
        "description": "How many choices to generate for the prompt, each an engine request of "
        "its own on the same prompt; usage counts the prompt once and the "
        "completion tokens of every choice. The tokens reserved against the tenant's budget "
        "are the prompt plus `n` times `max_tokens`.",
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
    "OpenAIError": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {
                        "type": "string",
                        "nullable": True,
                        "description": "The request field at fault; null when no one field is.",
                    },
                    "code": {"type": "string", "description": "See docs/errors.md."},
                },
            }
        },
    },
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
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {
                        "type": "array",
                        "items": {"type": "integer", "minimum": 0},
                        "minItems": 1,
                        "description": "Token ids.",
                    },
                ]
            },
            "max_tokens": {
                **_MAX_TOKENS,
                "default": 16,
                "description": "Unset: 16, as OpenAI's; null: the deployment's default "
                "(LORAPLEX_DEFAULT_MAX_TOKENS). " + _MAX_TOKENS_BOUNDS,
            },
            "logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
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
    "LoraName": {
        "type": "object",
        "required": [protocol.LORA_NAME],
        "properties": {
            protocol.LORA_NAME: {
                "type": "string",
                "description": "`<tenant>/<adapter>[@alias|:n]`",
            }
        },
        "additionalProperties": False,
    },
    "LoadLora": {
        "type": "object",
        "required": [protocol.LORA_NAME],
        "additionalProperties": False,
        "properties": {
            protocol.LORA_NAME: {
                "type": "string",
                "description": "`<tenant>/<adapter>[@alias|:n]`; with `lora_path`, "
                "`<tenant>/<adapter>`.",
            },
            protocol.LORA_PATH: {
                "type": "string",
                "description": "vLLM's: an absolute folder under LORAPLEX_LORA_PATH_ROOTS or "
                "`s3://bucket/prefix/` (a bucket in LORAPLEX_S3_IMPORT_BUCKETS), registered as "
                "the adapter's next version through validation and the quality gate.",
            },
            protocol.LOAD_INPLACE: {
                "type": "boolean",
                "description": "vLLM's: replace an adapter whose newest version holds other "
                "files (without it: 409).",
            },
        },
    },
    "OperatorResult": {
        "type": "object",
        "properties": {
            protocol.LORA_NAME: {"type": "string"},
            "action": {"type": "string"},
            "status": {"type": "string", "enum": ["ok"]},
            "version": {"type": "string", "description": "With `lora_path`: `tenant/adapter:n`."},
            "created": {"type": "boolean", "description": "With `lora_path`: a new version."},
        },
    },
    "LoadedAdapters": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"type": "string", "enum": ["list"]},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "adapter_id": {"type": "string"},
                        "tier": {"type": "string", "enum": ["device", "host", "disk"]},
                        "slot": {"type": "integer", "nullable": True},
                        "pinned": {"type": "boolean"},
                        "loading": {"type": "boolean"},
                        "rank": {"type": "integer", "nullable": True},
                        "running": {"type": "integer"},
                        "waiting": {"type": "integer"},
                    },
                },
            },
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


def _operator_action(action: str, summary: str, body: str = "LoraName") -> dict:
    return {
        "post": {
            "operationId": f"operator_{action}",
            "summary": summary,
            "tags": [OPERATOR_TAG],
            "security": OPERATOR_AUTH,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref(body)}},
            },
            "responses": {
                "200": {
                    "description": "Done.",
                    "content": {"application/json": {"schema": _ref("OperatorResult")}},
                },
                **_errors(400, 401, 403, 404, 405, 409, 503),
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
        "Completion of a plain prompt (text or token ids)", "CompletionRequest", "completions"
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
    protocol.path(protocol.LOAD): _operator_action(
        protocol.LOAD, "Load and pin an adapter (vLLM's body: files by `lora_path`)", "LoadLora"
    ),
    protocol.path(protocol.UNLOAD): _operator_action(protocol.UNLOAD, "Unload an adapter"),
    protocol.path(protocol.PIN): _operator_action(protocol.PIN, "Pin an adapter in a slot"),
    protocol.path(protocol.UNPIN): _operator_action(protocol.UNPIN, "Let the LRU evict it again"),
    protocol.path(protocol.LIST): {
        "get": {
            "operationId": "operator_lora_adapters",
            "summary": "The adapters this engine knows, by tier",
            "tags": [OPERATOR_TAG],
            "security": OPERATOR_AUTH,
            "responses": {
                "200": {
                    "description": "Every adapter the engine knows.",
                    "content": {"application/json": {"schema": _ref("LoadedAdapters")}},
                },
                **_errors(401, 403, 405),
            },
        }
    },
}

SECURITY_SCHEMES = {
    "OperatorToken": {
        "type": "http",
        "scheme": "bearer",
        "description": "LORAPLEX_OPERATOR_TOKEN (or a staff session).",
    }
}


def add_v1_paths(result: dict, generator=None, request=None, public=None) -> dict:
    """drf-spectacular postprocessing hook: the /v1 paths, their schemas and security."""
    result.setdefault("paths", {}).update(PATHS)
    components = result.setdefault("components", {})
    components.setdefault("schemas", {}).update(SCHEMAS)
    components.setdefault("securitySchemes", {}).update(SECURITY_SCHEMES)
    tags = result.setdefault("tags", [])
    tags.extend({"name": name} for name in (OPENAI_TAG, OPERATOR_TAG))
    return result
