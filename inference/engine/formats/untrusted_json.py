"""JSON from an uploaded file, read into one object or refused with a message naming it."""

import json
from typing import Any


def load_object(
    text: str | bytes, what: str, error: type[Exception], **hooks: Any
) -> dict[str, Any]:
    """`text` as a JSON object, else `error` saying what is wrong with `what`. A hook that
    refuses a value raises `error` itself, which passes through."""
    try:
        doc = json.loads(text, **hooks)
    except error:
        raise
    except RecursionError as e:
        raise error(f"{what} is nested too deeply") from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise error(f"{what} is not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise error(f"{what} must be a JSON object, not {type(doc).__name__}")
    return doc
