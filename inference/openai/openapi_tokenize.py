"""/tokenize and /detokenize in the OpenAPI schema (inference/openapi.py): the request schemas
describe what serving_tokenize.py accepts (tests/inference/openai/test_tokenize_api.py checks
the field sets)."""

from inference.openapi_common import KEY_OR_SESSION
from inference.openapi_common import errors as _errors
from inference.openapi_common import ref as _ref

from .openapi import OPENAI_TAG

_MODEL = {
    "type": "string",
    "minLength": 1,
    "description": "Whose tokenizer: the base model's name, `adapter`, `adapter@alias` or "
    "`adapter:n` (resolved in the caller's tenant). Unset: this replica's base model.",
}
_TOKENS = {"type": "array", "items": {"type": "integer", "minimum": 0}}

SCHEMAS: dict[str, dict] = {
    "TokenizeRequest": {
        "type": "object",
        "description": "Exactly one of `prompt` and `messages`.",
        "properties": {
            "model": _MODEL,
            "prompt": {"type": "string", "description": "Encoded as completions encode it."},
            "messages": {
                "type": "array",
                "items": _ref("ChatMessage"),
                "minItems": 1,
                "description": "Rendered with the chat template, as chat renders it.",
            },
            "add_special_tokens": {
                "type": "boolean",
                "description": "Default: true for a prompt, false for messages (the template "
                "writes its own).",
            },
            "add_generation_prompt": {
                "type": "boolean",
                "default": True,
                "description": "Messages only: end with the assistant's turn opening.",
            },
            "return_token_strs": {"type": "boolean", "default": False},
        },
        "additionalProperties": False,
    },
    "TokenizeResponse": {
        "type": "object",
        "required": ["count", "max_model_len", "tokens"],
        "properties": {
            "count": {"type": "integer"},
            "max_model_len": {
                "type": "integer",
                "description": "Prompt plus completion tokens this replica's engine holds.",
            },
            "tokens": _TOKENS,
            "token_strs": {
                "type": "array",
                "items": {"type": "string"},
                "nullable": True,
                "description": "With `return_token_strs`: each id's vocabulary entry.",
            },
        },
    },
    "DetokenizeRequest": {
        "type": "object",
        "required": ["tokens"],
        "properties": {"model": _MODEL, "tokens": _TOKENS},
        "additionalProperties": False,
    },
    "DetokenizeResponse": {
        "type": "object",
        "required": ["prompt"],
        "properties": {"prompt": {"type": "string"}},
    },
}


def _operation(operation_id: str, summary: str, request: str, response: str) -> dict:
    return {
        "post": {
            "operationId": operation_id,
            "summary": summary,
            "tags": [OPENAI_TAG],
            "security": KEY_OR_SESSION,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref(request)}},
            },
            "responses": {
                "200": {
                    "description": "The answer.",
                    "content": {"application/json": {"schema": _ref(response)}},
                },
                **_errors(400, 401, 403, 404, 405, 409, 413, 429, 503),
            },
        }
    }


PATHS: dict[str, dict] = {
    "/tokenize": _operation(
        "tokenize",
        "vLLM's: a prompt or a conversation as the token ids the model is shown",
        "TokenizeRequest",
        "TokenizeResponse",
    ),
    "/detokenize": _operation(
        "detokenize", "vLLM's: token ids as text", "DetokenizeRequest", "DetokenizeResponse"
    ),
}
