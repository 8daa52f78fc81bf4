"""Generated JSON schemas against a live `manage.py serve` (Hypothesis): whatever a schema
holds, the answer is never a 5xx and comes back (a bound against hangs only), and a 200
that finished its JSON holds a value the schema accepts."""

import json

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.clients import chat
from tests.inference.conftest import BASE_NAME

pytestmark = pytest.mark.django_db
ANSWER_SECONDS = 120  # a hang guard on a loaded machine, not a speed check

names = st.text("abcdefgh_", min_size=1, max_size=6)
numbers = st.one_of(
    st.integers(-(10**20), 10**20), st.floats(allow_nan=False, allow_infinity=False, width=32)
)
leaves = st.one_of(
    st.just({"type": "string"}),
    st.just({"type": "integer"}),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda low: {"type": "number", "minimum": low}, numbers),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 2000)),
    st.builds(
        lambda p: {"type": "string", "pattern": p},
        st.sampled_from(["^a{3}$", "^[0-9]{1,4}$", "^x{5000}$", "(", "^[a-z]+$"]),
    ),
    st.builds(
        lambda vs: {"enum": vs},
        st.lists(st.one_of(st.integers(), names, st.none()), min_size=1, max_size=5, unique=True),
    ),
    st.builds(lambda v: {"const": v}, st.one_of(st.integers(), names, st.just({"k": 1}))),
    st.just({"$ref": "#"}),
    st.just({}),
)


def containers(children):
    objects = st.builds(
        lambda props, required: {
            "type": "object",
            "properties": props,
            "required": [n for n in required if n in props],
        },
        st.dictionaries(names, children, max_size=4),
        st.lists(names, max_size=3),
    )
    arrays = st.builds(
        lambda items, low: {"type": "array", "items": items, "minItems": low},
        children,
        st.integers(0, 2),
    )
    branches = st.builds(lambda bs: {"anyOf": bs}, st.lists(children, min_size=1, max_size=3))
    return st.one_of(objects, arrays, branches)


schemas = st.recursive(leaves, containers, max_leaves=12)


@given(schema=schemas)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_schema_gets_a_server_error_and_every_finished_answer_validates(
    live_engine_server, schema
):
    response = chat(
        live_engine_server,
        live_engine_server.key_a,
        model=BASE_NAME,
        max_tokens=48,
        temperature=1.0,
        seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        timeout=ANSWER_SECONDS,
    )
    assert response.status_code < 500, response.text[:500]
    if response.status_code != 200:
        assert response.status_code == 400 and response.json()["error"]["param"], response.text
        return
    choice = response.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
