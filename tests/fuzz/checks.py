"""Checks beside Schemathesis's own, for what the schema cannot say about every answer."""

import json


def error_param_is_a_string_or_null(ctx, response, case) -> None:
    """Every 4xx is OpenAI's error object, whose `param` is a field path or null (clients
    read it as a string; a bare list index once slipped through)."""
    if not 400 <= response.status_code < 500:
        return
    try:
        error = json.loads(response.content)["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"a {response.status_code} without an error object") from None
    param = error.get("param", "missing")
    assert param is None or isinstance(param, str), (
        f"{case.method} {case.formatted_path}: `param` is {param!r}, not a string or null"
    )
