"""The operator endpoints' part of the OpenAPI schema (inference/openapi.py)."""

from typing import Any

from inference.openapi_common import OPERATOR_AUTH
from inference.openapi_common import errors as _errors
from inference.openapi_common import ref as _ref
from platform_site import operator_protocol as protocol

OPERATOR_TAG = "Operators"

_ROW = {
    "type": "object",
    "description": "A chat row (`messages`, as /v1/chat/completions takes them, without "
    "tool calls) or a text row (`prompt`), and the `completion` to score.",
    "required": ["completion"],
    "properties": {
        "messages": {"type": "array", "items": {"type": "object"}},
        "prompt": {"type": "string", "minLength": 1},
        "completion": {"type": "string", "minLength": 1},
    },
    "additionalProperties": False,
}
_TOTAL = {
    "type": "object",
    "nullable": True,
    "properties": {
        "tokens": {"type": "integer"},
        "nll": {"type": "number", "description": "Mean negative log-likelihood per token."},
        "perplexity": {"type": "number", "description": "exp(nll)."},
    },
}

SCHEMAS: dict[str, dict[str, Any]] = {
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
    "ScoreRequest": {
        "type": "object",
        "required": [protocol.ADAPTER_VERSION, protocol.ROWS],
        "additionalProperties": False,
        "properties": {
            protocol.ADAPTER_VERSION: {
                "type": "string",
                "format": "uuid",
                "nullable": True,
                "description": "The version's uid (it must be ready and checked compatible "
                "with the revision this engine serves; no alias or evaluation gate applies), "
                "or null to score the base model alone.",
            },
            protocol.ROWS: {"type": "array", "minItems": 1, "items": _ROW},
        },
    },
    "ScoreResult": {
        "type": "object",
        "description": "Each row's completion scored under the adapter and under the base "
        "model alone. A chat row's completion ends with the token that ends the assistant's "
        "turn in the chat template (ChatML's `<|im_end|>`), counted in `tokens`; a text "
        "row's is scored as it is.",
        "properties": {
            protocol.ADAPTER_VERSION: {"type": "string", "nullable": True},
            "base_revision": {
                "type": "string",
                "description": "The base model revision the figures were computed on.",
            },
            protocol.ROWS: {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "tokens": {"type": "integer"},
                        "adapter_nll": {
                            "type": "number",
                            "nullable": True,
                            "description": "Summed negative log-likelihood; null without "
                            "a version.",
                        },
                        "base_nll": {"type": "number"},
                    },
                },
            },
            "adapter": _TOTAL,
            "base": _TOTAL,
        },
    },
}


def _action(action: str, summary: str, body: str = "LoraName") -> dict:
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
    protocol.path(protocol.LOAD): _action(
        protocol.LOAD, "Load and pin an adapter (vLLM's body: files by `lora_path`)", "LoadLora"
    ),
    protocol.path(protocol.UNLOAD): _action(protocol.UNLOAD, "Unload an adapter"),
    protocol.path(protocol.PIN): _action(protocol.PIN, "Pin an adapter in a slot"),
    protocol.path(protocol.UNPIN): _action(protocol.UNPIN, "Let the LRU evict it again"),
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
    protocol.path(protocol.SCORE): {
        "post": {
            "operationId": "operator_score",
            "summary": "Score an eval set under an adapter version and the base model (the "
            "quality gate)",
            "tags": [OPERATOR_TAG],
            "security": OPERATOR_AUTH,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("ScoreRequest")}},
            },
            "responses": {
                "200": {
                    "description": "Per row and in total.",
                    "content": {"application/json": {"schema": _ref("ScoreResult")}},
                },
                **_errors(400, 401, 403, 404, 405, 409, 503),
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
