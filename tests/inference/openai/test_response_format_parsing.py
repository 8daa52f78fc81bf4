"""`response_format` parsing alone: the three OpenAI forms on both endpoints, and each bad
shape refused naming the field at fault."""

import pytest

from inference.errors import ProtocolError
from tests.inference.openai.bodies import parsed_chat, parsed_completion

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}},
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("parse", [parsed_chat, parsed_completion])
def test_text_and_null_change_nothing(parse):
    assert parse(response_format={"type": "text"}).constraint is None
    assert parse(response_format=None).constraint is None


@pytest.mark.parametrize("parse", [parsed_chat, parsed_completion])
def test_json_object_asks_for_any_object(parse):
    constraint = parse(response_format={"type": "json_object"}).constraint
    assert constraint.schema is None and constraint.param == "response_format"


@pytest.mark.parametrize("parse", [parsed_chat, parsed_completion])
@pytest.mark.parametrize("strict", [True, False, None])
def test_json_schema_asks_for_its_schema(parse, strict):
    spec = {"name": "city-answer_1", "schema": SCHEMA, "strict": strict, "description": "A city."}
    constraint = parse(response_format={"type": "json_schema", "json_schema": spec}).constraint
    assert constraint.schema == SCHEMA
    assert constraint.param == "response_format.json_schema.schema"


def schema_spec(**changes):
    spec = {"name": "answer", "schema": SCHEMA, **changes}
    return {"type": "json_schema", "json_schema": {k: v for k, v in spec.items() if v != "DROP"}}


@pytest.mark.parametrize("parse", [parsed_chat, parsed_completion])
@pytest.mark.parametrize(
    "value, param, words",
    [
        ("json_object", "response_format", "must be an object"),
        ({}, "response_format.type", "text, json_object, json_schema"),
        ({"type": "xml"}, "response_format.type", "got 'xml'"),
        ({"type": "text", "json_schema": {}}, "response_format", "json_schema"),
        ({"type": "json_object", "schema": SCHEMA}, "response_format", "schema"),
        ({"type": "json_schema"}, "response_format.json_schema", "required"),
        ({"type": "json_schema", "json_schema": SCHEMA}, "response_format.json_schema", "type"),
        ({"type": "json_schema", "schema": SCHEMA}, "response_format", "schema"),
        (schema_spec(name="DROP"), "response_format.json_schema.name", "a-z"),
        (schema_spec(name="a b"), "response_format.json_schema.name", "a-z"),
        (schema_spec(name="x" * 65), "response_format.json_schema.name", "1 to 64"),
        (schema_spec(name=7), "response_format.json_schema.name", "a-z"),
        (schema_spec(schema="DROP"), "response_format.json_schema.schema", "required"),
        (
            schema_spec(schema='{"type": "object"}'),
            "response_format.json_schema.schema",
            "JSON Schema object",
        ),
        (schema_spec(schema=True), "response_format.json_schema.schema", "JSON Schema object"),
        (
            schema_spec(schema={"type": "object", "properties": {"a": {"type": "strnig"}}}),
            "response_format.json_schema.schema",
            "'strnig' is not valid",
        ),
        (
            schema_spec(schema={"minLength": -1}),
            "response_format.json_schema.schema",
            "not a valid JSON Schema",
        ),
        (schema_spec(strict="yes"), "response_format.json_schema.strict", "boolean"),
        (schema_spec(description=["a"]), "response_format.json_schema.description", "string"),
    ],
)
def test_a_bad_response_format_is_refused_naming_the_field(parse, value, param, words):
    with pytest.raises(ProtocolError) as caught:
        parse(response_format=value)
    assert caught.value.param == param and caught.value.code == "invalid_request"
    assert words in caught.value.message, caught.value.message
