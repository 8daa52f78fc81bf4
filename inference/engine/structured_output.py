"""What a request asks its output to be: JSON matching a schema, or any JSON object.

A plain, hashable value (the schema travels as canonical JSON text), so it is the key of
the engine's grammar cache and costs nothing to compare. Nothing here needs the grammar
engine: a request is described and checked without it.
"""

import json
from dataclasses import dataclass
from typing import Any

from .errors import SamplingParamsError, UnsupportedSchemaError


@dataclass(frozen=True)
class StructuredOutput:
    """Exactly one of: `json_schema`, a JSON schema as JSON text (build it with
    `from_schema`), or `json_object`, any JSON object (`any_json_object()`)."""

    json_schema: str | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.json_object, bool):
            raise SamplingParamsError(
                f"structured_output.json_object must be a boolean, got {self.json_object!r}"
            )
        if (self.json_schema is not None) == self.json_object:
            raise SamplingParamsError(
                "structured_output needs exactly one of json_schema and json_object"
            )
        if self.json_schema is not None:
            if not isinstance(self.json_schema, str):
                raise UnsupportedSchemaError(
                    f"the JSON schema must be JSON text, got {type(self.json_schema).__name__}"
                )
            try:
                schema = json.loads(self.json_schema)
            except ValueError as e:
                raise UnsupportedSchemaError(f"the JSON schema is not valid JSON: {e}") from e
            _check_object(schema)

    @classmethod
    def from_schema(cls, schema: dict[str, Any]) -> "StructuredOutput":
        """The structured output for a JSON schema given as a dict. Key order is kept: it is
        the order the properties are generated in."""
        _check_object(schema)
        try:
            text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as e:  # a set, an object, NaN...
            raise UnsupportedSchemaError(f"the JSON schema is not JSON: {e}") from e
        return cls(json_schema=text)

    @classmethod
    def any_json_object(cls) -> "StructuredOutput":
        return cls(json_object=True)

    def schema(self) -> dict[str, Any]:
        """The JSON schema the output must match ({"type": "object"} for any JSON object)."""
        if self.json_schema is None:
            return {"type": "object"}
        schema: dict[str, Any] = json.loads(self.json_schema)
        return schema


def _check_object(schema: object) -> None:
    if not isinstance(schema, dict):
        raise UnsupportedSchemaError(
            f"the JSON schema must be a JSON object, got {type(schema).__name__}"
        )
