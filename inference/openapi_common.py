"""What the serving layer's OpenAPI fragments share: references, error answers, security."""

from typing import Any

# The key scheme drf-spectacular derives from tenants/authentication.py, and the session.
KEY_OR_SESSION: list[dict[str, list]] = [{"ApiKey": []}, {"cookieAuth": []}]
OPERATOR_AUTH: list[dict[str, list]] = [{"OperatorToken": []}, {"cookieAuth": []}]

ERROR_REF = {"$ref": "#/components/schemas/OpenAIError"}

ERROR_SCHEMAS: dict[str, dict[str, Any]] = {
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
}


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def errors(*statuses: int) -> dict[str, dict]:
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
            "content": {"application/json": {"schema": ERROR_REF}},
        }
        for status in statuses
    }
