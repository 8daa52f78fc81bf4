"""OpenAI's own published schema (openai_schema/: the chat, completion and model schemas, and
the Responses API's, each file naming its source), as JSON Schema: where an answer of ours
breaks it."""

import json
from functools import cache
from pathlib import Path

import yaml
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

SCHEMA_DIR = Path(__file__).parent / "openai_schema"


def _json_schema(node):
    """OpenAI's OpenAPI 3.1 document still marks some fields the 3.0 way, `nullable: true`,
    which JSON Schema ignores: say it in JSON Schema's words (null, or the schema)."""
    if isinstance(node, list):
        return [_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _json_schema(value) for key, value in node.items()}
    if node.get("nullable") is True:
        del node["nullable"]
        return {"anyOf": [node, {"type": "null"}]}
    return node


@cache
def _document() -> dict:
    """Every file's components, as one document (they are parts of the same one)."""
    schemas: dict = {}
    for part in sorted(SCHEMA_DIR.glob("*.yaml")):
        schemas |= yaml.safe_load(part.read_text())["components"]["schemas"]
    return _json_schema({"components": {"schemas": schemas}})


def schema_problems(name: str, instance) -> list[str]:
    """Where `instance` breaks OpenAI's schema `name` (components/schemas), one line each."""
    validator = Draft202012Validator({**_document(), "$ref": f"#/components/schemas/{name}"})
    return [
        f"{'/'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}"
        for error in sorted(validator.iter_errors(instance), key=str)
    ]


def assert_fits(name: str, instance) -> None:
    problems = schema_problems(name, instance)
    assert not problems, f"{name}:\n" + "\n".join(problems) + f"\n{json.dumps(instance)[:2000]}"
