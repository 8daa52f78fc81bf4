"""JSON schemas the structured-output tests and benchmarks share, each with a valid and an
invalid instance. Every string, number and array is bounded, so a random-weight model
sampling at temperature 1 still closes its JSON within a few dozen tokens."""

from typing import Any

Schema = dict[str, Any]

NESTED: Schema = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 6},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "address"],
    "additionalProperties": False,
}
ARRAY_BOUNDS: Schema = {
    "type": "object",
    "properties": {
        "scores": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 100},
            "minItems": 2,
            "maxItems": 4,
        }
    },
    "required": ["scores"],
    "additionalProperties": False,
}
ENUMS: Schema = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "size": {"type": "string", "enum": ["S", "M", "L", "XL"]},
    },
    "required": ["color", "size"],
    "additionalProperties": False,
}
INTEGER_RANGES: Schema = {
    "type": "object",
    "properties": {
        "age": {"type": "integer", "minimum": 18, "maximum": 65},
        "floor": {"type": "integer", "minimum": -3, "maximum": 12},
    },
    "required": ["age", "floor"],
    "additionalProperties": False,
}
STRING_PATTERN: Schema = {
    "type": "object",
    "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"}},
    "required": ["code"],
    "additionalProperties": False,
}
OPTIONAL_FIELDS: Schema = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 999},
        "nickname": {"type": "string", "maxLength": 6},
        "active": {"type": "boolean"},
    },
    "required": ["id"],
    "additionalProperties": False,
}

# name -> (schema, a valid instance, an invalid one)
CASES: dict[str, tuple[Schema, Any, Any]] = {
    "nested": (
        NESTED,
        {"name": "Ada", "address": {"city": "Paris", "zip": "75001"}},
        {"name": "Ada", "address": {"city": "Paris", "zip": "7500"}},
    ),
    "array_bounds": (ARRAY_BOUNDS, {"scores": [3, 100, 42]}, {"scores": [1, 2, 3, 4, 5]}),
    "enums": (ENUMS, {"color": "green", "size": "XL"}, {"color": "pink", "size": "S"}),
    "integer_ranges": (INTEGER_RANGES, {"age": 30, "floor": -2}, {"age": 17, "floor": 0}),
    "string_pattern": (STRING_PATTERN, {"code": "ABC-123"}, {"code": "AB-123"}),
    "optional_fields": (OPTIONAL_FIELDS, {"id": 7, "active": True}, {"nickname": "x"}),
}

# Keywords neither engine can enforce, each in a schema of its own.
UNSUPPORTED: dict[str, Schema] = {
    "if/then": {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}},
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}},
    "not": {"not": {"type": "string"}},
}
