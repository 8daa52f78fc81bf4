"""A request whose text must be JSON: the constraint, the rules its names and schemas follow,
and compiling it before the engine sees the request.

`response_format` (response_format.py) and forced tool calls (tools.py)
both end here, as one `JsonConstraint`. Compiling it during preparation, off the event
loop, turns a schema the engine cannot enforce into a 400 naming the field that carried it,
before a token is reserved or the engine does any work.
"""

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inference.errors import ProtocolError, UnsupportedParameter

from .schema_limits import SchemaBudget
from .schema_satisfiable import refuse_endless_refs

if TYPE_CHECKING:
    from inference.engine import AsyncLLMEngine, StructuredOutput

MAX_DETAIL = 200  # characters of a checker's own words quoted back (they can quote the schema)
# OpenAI's rule for a json_schema's and a function's name.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class JsonConstraint:
    """The output must be JSON: any object when `schema` is None, else valid against `schema`.
    `param` names the request field that asked for it, for a refusal of the schema."""

    schema: dict[str, Any] | None
    param: str

    def structured_output(self) -> "StructuredOutput":
        from inference.engine import StructuredOutput

        if self.schema is None:
            return StructuredOutput.any_json_object()
        return StructuredOutput.from_schema(self.schema)


def require_name(value, param: str) -> str:
    if not (isinstance(value, str) and NAME_PATTERN.fullmatch(value)):
        raise ProtocolError(
            f"{param} must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -; got {value!r}.",
            param=param,
        )
    return value


def require_json_schema(value, param: str, budget: SchemaBudget) -> dict[str, Any]:
    """A JSON Schema object within the request's bounds (counted first: the checks after it
    cost more than linear time in some shapes) that its own meta-schema accepts, so a typo
    (`"type": "strnig"`) is named here rather than failing obscurely in the engine, and that
    admits some finite value."""
    from jsonschema import SchemaError, validators  # type: ignore[import-untyped]

    if not isinstance(value, dict):
        raise ProtocolError(f"{param} must be a JSON Schema object.", param=param)
    budget.check(value, param)
    try:
        validators.validator_for(value).check_schema(value)
    except SchemaError as exc:
        where = "".join(f"[{p!r}]" for p in exc.path)[:MAX_DETAIL]
        raise ProtocolError(
            f"{param} is not a valid JSON Schema: {_cut(exc.message)}"
            + (f" (at {where})" if where else "")
            + ".",
            param=param,
        ) from None
    refuse_endless_refs(value, param)
    return value


def _cut(text: str) -> str:
    return text if len(text) <= MAX_DETAIL else text[:MAX_DETAIL] + "..."


async def compile_constraint(
    engine: "AsyncLLMEngine", constraint: JsonConstraint
) -> "StructuredOutput":
    """The engine's form of the constraint, compiled (and cached by the engine) now: a schema
    it cannot enforce is the caller's 400, naming `constraint.param`."""
    from inference.engine import InvalidRequestError, StructuredOutputUnavailableError

    try:
        spec = constraint.structured_output()
        await engine.compile_structured_output(spec)
    except StructuredOutputUnavailableError as exc:  # this server cannot constrain at all
        field = re.match(r"[a-z_]+", constraint.param)
        raise UnsupportedParameter(str(exc), param=field[0] if field else None) from None
    except InvalidRequestError as exc:  # UnsupportedSchemaError: the message names why
        raise ProtocolError(f"{constraint.param}: {exc}", param=constraint.param) from None
    return spec
