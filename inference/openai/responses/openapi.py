"""The Responses API's part of the OpenAPI schema (inference/openapi.py). The request schema
describes what protocol.py accepts: its properties are checked against the parser's field
sets (tests/inference/openai/test_openapi_fields.py)."""

from typing import Any

from inference.openapi_common import KEY_OR_SESSION
from inference.openapi_common import errors as _errors
from inference.openapi_common import ref as _ref

from ..protocol import MAX_COUNT
from ..tools import MAX_TOOLS
from .protocol import MAX_METADATA_KEY, MAX_METADATA_PAIRS, MAX_METADATA_VALUE

TAG = "OpenAI-compatible"
_NAME_PATTERN = "^[a-zA-Z0-9_-]{1,64}$"
_TEXT = {"type": "string"}
_INPUT_TEXT = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"type": "string", "enum": ["input_text"]}, "text": _TEXT},
    "additionalProperties": False,
}
_OUTPUT_TEXT = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {
        "type": {"type": "string", "enum": ["output_text"]},
        "text": _TEXT,
        "annotations": {"type": "array", "maxItems": 0},
        "logprobs": {"type": "array", "maxItems": 0},
    },
    "additionalProperties": False,
}
_STATUS = {"type": "string", "enum": ["in_progress", "completed", "incomplete"]}
_CALL_ID = {"type": "string", "minLength": 1}

SCHEMAS: dict[str, dict[str, Any]] = {
    "ResponseInputItem": {
        "description": "A message (roles user, system, developer, assistant; text only), a "
        "`function_call` the model made, or the `function_call_output` answering it (right "
        "after the turn that made the call). The output items of a response may be sent back "
        "as they came.",
        "oneOf": [
            {
                "type": "object",
                "title": "Message",
                "required": ["role", "content"],
                "properties": {
                    "type": {"type": "string", "enum": ["message"]},
                    "role": {
                        "type": "string",
                        "enum": ["user", "system", "developer", "assistant"],
                    },
                    "content": {
                        "oneOf": [
                            {"type": "string", "minLength": 1},
                            {"type": "array", "items": {"oneOf": [_INPUT_TEXT, _OUTPUT_TEXT]}},
                        ],
                        "description": "Not blank, except in an assistant's message. "
                        "`output_text` parts only in an assistant's.",
                    },
                    "id": _TEXT,
                    "status": _STATUS,
                },
                "additionalProperties": False,
            },
            {
                "type": "object",
                "title": "Function call",
                "required": ["type", "call_id", "name", "arguments"],
                "properties": {
                    "type": {"type": "string", "enum": ["function_call"]},
                    "call_id": _CALL_ID,
                    "name": {"type": "string", "minLength": 1},
                    "arguments": {"type": "string", "description": "A JSON object."},
                    "id": _TEXT,
                    "status": _STATUS,
                },
                "additionalProperties": False,
            },
            {
                "type": "object",
                "title": "Function call output",
                "required": ["type", "call_id", "output"],
                "properties": {
                    "type": {"type": "string", "enum": ["function_call_output"]},
                    "call_id": _CALL_ID,
                    "output": {"oneOf": [_TEXT, {"type": "array", "items": _INPUT_TEXT}]},
                    "id": _TEXT,
                    "status": _STATUS,
                },
                "additionalProperties": False,
            },
        ],
    },
    "ResponseFunctionTool": {
        "type": "object",
        "required": ["type", "name"],
        "description": "Only function tools: OpenAI's built-in tools (web search, file "
        "search, computer use, MCP, ...) are a 400 naming `tools[i].type`.",
        "properties": {
            "type": {"type": "string", "enum": ["function"]},
            "name": {"type": "string", "pattern": _NAME_PATTERN},
            "description": _TEXT,
            "parameters": {
                "type": "object",
                "nullable": True,
                "description": 'A JSON Schema with "type": "object"; null: no arguments.',
            },
            "strict": {"type": "boolean", "nullable": True},
        },
        "additionalProperties": False,
    },
    "ResponseRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": {
                "type": "string",
                "minLength": 1,
                "description": "The base model's name, `adapter`, `adapter@alias` or `adapter:n`.",
            },
            "input": {
                "oneOf": [
                    {"type": "string", "minLength": 1, "description": "A user message."},
                    {"type": "array", "minItems": 1, "items": _ref("ResponseInputItem")},
                ]
            },
            "instructions": {
                "type": "string",
                "nullable": True,
                "description": "A system message before the input; not carried over to a "
                "response that continues this one.",
            },
            "previous_response_id": {
                "type": "string",
                "nullable": True,
                "description": "A response of this tenant's, stored (`store` on) and not past "
                "LORAPLEX_RESPONSES_RETENTION_DAYS: its input and output come before `input`. "
                "Any other id is a 404 `not_found`.",
            },
            "store": {
                "type": "boolean",
                "nullable": True,
                "default": True,
                "description": "Keep the response for `previous_response_id` and GET; false "
                "keeps nothing.",
            },
            "max_output_tokens": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_COUNT,
                "nullable": True,
                "description": "Unset or null: the deployment's default "
                "(LORAPLEX_DEFAULT_MAX_TOKENS), within the cap and the context.",
            },
            "temperature": {"type": "number", "minimum": 0, "maximum": 2, "nullable": True},
            "top_p": {
                "type": "number",
                "minimum": 0,
                "exclusiveMinimum": True,
                "maximum": 1,
                "nullable": True,
            },
            "tools": {
                "type": "array",
                "maxItems": MAX_TOOLS,
                "nullable": True,
                "items": _ref("ResponseFunctionTool"),
            },
            "tool_choice": {
                "nullable": True,
                "oneOf": [
                    {"type": "string", "enum": ["none", "auto", "required"]},
                    {
                        "type": "object",
                        "required": ["type", "name"],
                        "properties": {
                            "type": {"type": "string", "enum": ["function"]},
                            "name": _TEXT,
                        },
                        "additionalProperties": False,
                    },
                ],
            },
            "parallel_tool_calls": {"type": "boolean", "nullable": True},
            "text": {
                "type": "object",
                "nullable": True,
                "properties": {
                    "format": {
                        "nullable": True,
                        "description": "`text` (no effect), `json_object` (any JSON object) "
                        "or `json_schema` (JSON valid against `schema`). Not with tools unless "
                        '`tool_choice` is "none".',
                        "oneOf": [
                            {
                                "type": "object",
                                "required": ["type"],
                                "properties": {
                                    "type": {"type": "string", "enum": ["text", "json_object"]}
                                },
                                "additionalProperties": False,
                            },
                            {
                                "type": "object",
                                "required": ["type", "name", "schema"],
                                "properties": {
                                    "type": {"type": "string", "enum": ["json_schema"]},
                                    "name": {"type": "string", "pattern": _NAME_PATTERN},
                                    "schema": {"type": "object"},
                                    "strict": {"type": "boolean", "nullable": True},
                                    "description": _TEXT,
                                },
                                "additionalProperties": False,
                            },
                        ],
                    },
                    "verbosity": {"type": "string", "enum": ["medium"], "nullable": True},
                },
                "additionalProperties": False,
            },
            "stream": {"type": "boolean", "nullable": True, "default": False},
            "stream_options": {
                "type": "object",
                "nullable": True,
                "properties": {"include_obfuscation": {"type": "boolean"}},
                "additionalProperties": False,
                "description": "Accepted; events are never padded.",
            },
            "metadata": {
                "type": "object",
                "nullable": True,
                "maxProperties": MAX_METADATA_PAIRS,
                "additionalProperties": {"type": "string", "maxLength": MAX_METADATA_VALUE},
                "description": f"Keys of at most {MAX_METADATA_KEY} characters; echoed and "
                "stored with the response.",
            },
            "reasoning": {
                "type": "object",
                "nullable": True,
                "description": 'Only the neutral settings: no effort (or "none"), no summary.',
                "properties": {
                    "effort": {"type": "string", "enum": ["none"], "nullable": True},
                    "summary": {"type": "string", "enum": [None], "nullable": True},
                },
                "additionalProperties": False,
            },
            "user": _TEXT,
            "safety_identifier": _TEXT,
            "prompt_cache_key": _TEXT,
            "service_tier": _TEXT,
        },
    },
    "Response": {
        "type": "object",
        "required": ["id", "object", "created_at", "status", "model", "output"],
        "description": "OpenAI's response object: `output` holds `message` items (one "
        "`output_text` part) and `function_call` items, in the order the model wrote them; "
        "`usage` counts `input_tokens`, `output_tokens`, `total_tokens`.",
        "properties": {
            "id": _TEXT,
            "object": {"type": "string", "enum": ["response"]},
            "created_at": {"type": "integer"},
            "status": {"type": "string", "enum": ["completed", "incomplete", "failed"]},
            "model": _TEXT,
            "output": {"type": "array", "items": {"type": "object"}},
            "usage": {
                "type": "object",
                "properties": {
                    "input_tokens": {"type": "integer"},
                    "output_tokens": {"type": "integer"},
                    "total_tokens": {"type": "integer"},
                },
            },
        },
    },
    "ResponseDeleted": {
        "type": "object",
        "required": ["id", "object", "deleted"],
        "properties": {
            "id": _TEXT,
            "object": {"type": "string", "enum": ["response"]},
            "deleted": {"type": "boolean", "enum": [True]},
        },
    },
}

_RESPONSE_ID = {
    "name": "response_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "A response's `id`, as POST /v1/responses answered it.",
}

PATHS: dict[str, dict] = {
    "/v1/responses": {
        "post": {
            "operationId": "responses",
            "summary": "A response to text or conversation items (OpenAI's Responses API)",
            "tags": [TAG],
            "security": KEY_OR_SESSION,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("ResponseRequest")}},
            },
            "responses": {
                "200": {
                    "description": "The response; with `stream`, server-sent events named by "
                    "their `type` (response.created ... response.completed), each with its "
                    "`sequence_number`.",
                    "content": {
                        "application/json": {"schema": _ref("Response")},
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                **_errors(400, 401, 403, 404, 405, 409, 413, 429, 503),
            },
        }
    },
    "/v1/responses/{response_id}": {
        "get": {
            "operationId": "response",
            "summary": "A stored response of the caller's tenant",
            "tags": [TAG],
            "security": KEY_OR_SESSION,
            "parameters": [_RESPONSE_ID],
            "responses": {
                "200": {
                    "description": "The response as it was answered.",
                    "content": {"application/json": {"schema": _ref("Response")}},
                },
                **_errors(401, 403, 404, 405),
            },
        },
        "delete": {
            "operationId": "response_delete",
            "summary": "Delete a stored response of the caller's tenant",
            "tags": [TAG],
            "security": KEY_OR_SESSION,
            "parameters": [_RESPONSE_ID],
            "responses": {
                "200": {
                    "description": "Deleted.",
                    "content": {"application/json": {"schema": _ref("ResponseDeleted")}},
                },
                **_errors(401, 403, 404, 405),
            },
        },
    },
}
