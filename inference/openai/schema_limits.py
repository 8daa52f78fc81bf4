"""Bounds on the JSON schemas a caller sends (`response_format`, tools' `parameters`),
checked in one linear walk before anything costlier looks at them.

Checking a schema against its meta-schema, and compiling it into a grammar, cost more than
linear time in some shapes (a draft-04 `enum` of objects is compared pairwise; every
`anyOf` branch and property becomes grammar rules; `a{1000000}` a million of them). A
request's schemas share one budget, so the bound holds however they are split over tools.
Every refusal names the request field that carried the schema and where inside it the
bound was crossed.
"""

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from inference.errors import ProtocolError

# Keywords whose numbers the grammar engine turns into counts or bounds.
_NUMBER_KEYWORDS = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
)
_COUNT_KEYWORDS = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
)
_BRANCH_KEYWORDS = ("anyOf", "oneOf", "allOf")
_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
MAX_EXACT_NUMBER = 2**53  # beyond it a JSON number is not an exact double
MAX_SHOWN_PATH = 120  # characters of the path inside a schema quoted in a refusal
_SETTING_OF = {
    "properties": "LORAPLEX_SCHEMA_MAX_PROPERTIES",
    "enum values": "LORAPLEX_SCHEMA_MAX_ENUM_VALUES",
    "enum values that are objects or arrays": "LORAPLEX_SCHEMA_MAX_STRUCTURED_ENUM_VALUES",
    **{f"{key} branches": "LORAPLEX_SCHEMA_MAX_BRANCHES" for key in ("anyOf", "oneOf", "allOf")},
}


@dataclass(frozen=True)
class SchemaLimits:
    max_bytes: int  # all the request's schemas, as compact JSON
    max_depth: int  # nesting of objects and arrays inside one schema
    max_properties: int
    max_enum_values: int  # enum values and consts
    max_structured_enum_values: int  # of those, objects and arrays (compared pairwise)
    max_branches: int  # anyOf, oneOf and allOf alternatives
    max_repeat: int  # a pattern's {n,m}, and every length or count keyword

    @classmethod
    def from_settings(cls) -> "SchemaLimits":
        return cls(**settings.SCHEMA_LIMITS)


@dataclass
class SchemaBudget:
    """What one request's schemas have used so far."""

    limits: SchemaLimits = field(default_factory=SchemaLimits.from_settings)
    bytes: int = 0
    properties: int = 0
    enum_values: int = 0
    structured_enum_values: int = 0
    branches: int = 0

    def check(self, schema: Any, param: str) -> None:
        """Count `schema` (carried in the request's field `param`) against the bounds."""
        self._charge_size(schema, param)
        stack: list[tuple[Any, str, int]] = [(schema, "", 0)]
        while stack:
            node, where, depth = stack.pop()
            if depth > self.limits.max_depth:
                self._refuse(
                    param,
                    where,
                    f"nests deeper than {self.limits.max_depth} levels (LORAPLEX_SCHEMA_MAX_DEPTH)",
                )
            if isinstance(node, dict):
                self._count_keywords(node, param, where)
                stack.extend(
                    (value, f"{where}.{key}" if where else str(key), depth + 1)
                    for key, value in node.items()
                )
            elif isinstance(node, list):
                stack.extend((value, f"{where}[{i}]", depth + 1) for i, value in enumerate(node))

    def _charge_size(self, schema: Any, param: str) -> None:
        try:
            size = len(json.dumps(schema, separators=(",", ":")))
        except (ValueError, RecursionError):  # NaN or Infinity, or nested past Python's stack
            raise ProtocolError(
                f"{param} is not a JSON Schema this server can read (a number JSON cannot "
                "hold, or nesting too deep).",
                param=param,
            ) from None
        self.bytes += size
        if self.bytes > self.limits.max_bytes:
            raise ProtocolError(
                f"{param}: the request's JSON schemas take {self.bytes} bytes; at most "
                f"{self.limits.max_bytes} (LORAPLEX_SCHEMA_MAX_BYTES).",
                param=param,
            )

    def _count_keywords(self, node: dict, param: str, where: str) -> None:
        limits = self.limits
        properties = node.get("properties")
        if isinstance(properties, dict):
            self.properties += len(properties)
            self._bound(self.properties, limits.max_properties, "properties", param, where)
        for key in _BRANCH_KEYWORDS:
            if isinstance(node.get(key), list):
                self.branches += len(node[key])
                self._bound(self.branches, limits.max_branches, f"{key} branches", param, where)
        values = list(node["enum"]) if isinstance(node.get("enum"), list) else []
        values += [node["const"]] if "const" in node else []
        self.enum_values += len(values)
        self._bound(self.enum_values, limits.max_enum_values, "enum values", param, where)
        self.structured_enum_values += sum(isinstance(v, dict | list) for v in values)
        self._bound(
            self.structured_enum_values,
            limits.max_structured_enum_values,
            "enum values that are objects or arrays",
            param,
            where,
        )
        self._check_numbers(node, param, where)
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            self._check_pattern(pattern, param, f"{where}.pattern" if where else "pattern")

    def _check_numbers(self, node: dict, param: str, where: str) -> None:
        for key in _NUMBER_KEYWORDS + _COUNT_KEYWORDS:
            value = node.get(key)
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            at = f"{where}.{key}" if where else key
            bound = self.limits.max_repeat if key in _COUNT_KEYWORDS else MAX_EXACT_NUMBER
            if not math.isfinite(value) or abs(value) > bound:
                self._refuse(param, at, f"is {_short(value)}; at most {bound} in magnitude")

    def _check_pattern(self, pattern: str, param: str, where: str) -> None:
        for match in _REPEAT.finditer(pattern):
            counts = [int(n) for n in match.groups() if n]
            if any(count > self.limits.max_repeat for count in counts):
                self._refuse(
                    param,
                    where,
                    f"repeats {match.group(0)}; a pattern may repeat at most "
                    f"{self.limits.max_repeat} times (LORAPLEX_SCHEMA_MAX_REPEAT)",
                )

    def _bound(self, used: int, limit: int, what: str, param: str, where: str) -> None:
        if used > limit:
            setting = _SETTING_OF[what]
            self._refuse(
                param,
                where,
                f"brings the request's schemas to {used} {what}; at most {limit} ({setting})",
            )

    @staticmethod
    def _refuse(param: str, where: str, problem: str) -> None:
        if len(where) > MAX_SHOWN_PATH:  # deep nesting: its start and end say where
            half = MAX_SHOWN_PATH // 2
            where = f"{where[:half]}...{where[-half:]}"
        at = f" at {where}" if where else ""
        raise ProtocolError(f"{param}{at} {problem}.", param=param)


def _short(value: int | float) -> str:
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} digits)"
