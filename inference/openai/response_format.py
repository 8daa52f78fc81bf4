"""`response_format`, as OpenAI defines it: plain text, any JSON object, or JSON valid against
a named schema. Pure parsing; every refusal names the field at fault."""

from inference.errors import ProtocolError

from .constraints import JsonConstraint, require_json_schema, require_name
from .fields import refuse_extra_fields
from .schema_limits import SchemaBudget

PARAM = "response_format"
_TYPES = ("text", "json_object", "json_schema")
_JSON_SCHEMA_FIELDS = {"name", "schema", "strict", "description"}


def parse_response_format(value, budget: SchemaBudget | None = None) -> JsonConstraint | None:
    """None for plain text (absent, null or `{"type": "text"}`), else the output's constraint.
    `strict` is accepted either way: the output is always held to the schema."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in _TYPES:
        raise ProtocolError(
            f"{PARAM} must be an object whose type is one of {', '.join(_TYPES)}; got "
            f"{kind if isinstance(value, dict) else value!r}.",
            param=PARAM if not isinstance(value, dict) else f"{PARAM}.type",
        )
    allowed = {"type", "json_schema"} if kind == "json_schema" else {"type"}
    refuse_extra_fields(value, allowed, PARAM)
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonConstraint(schema=None, param=PARAM)
    where = f"{PARAM}.json_schema"
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise ProtocolError(
            f'{where} is required with type "json_schema": an object with name and schema.',
            param=where,
        )
    refuse_extra_fields(spec, _JSON_SCHEMA_FIELDS, where)
    require_name(spec.get("name"), f"{where}.name")
    if "schema" not in spec:
        raise ProtocolError(f"{where}.schema is required (a JSON Schema).", param=f"{where}.schema")
    schema = require_json_schema(spec["schema"], f"{where}.schema", budget or SchemaBudget())
    if spec.get("strict") not in (None, True, False):
        raise ProtocolError(f"{where}.strict must be a boolean.", param=f"{where}.strict")
    if not isinstance(spec.get("description", ""), str):
        raise ProtocolError(f"{where}.description must be a string.", param=f"{where}.description")
    return JsonConstraint(schema=schema, param=f"{where}.schema")
