"""Schemas a hostile tenant sends, through a live `manage.py serve`: each is a 400 naming the
field that carried it, answered before any stream starts, in words without a backtrace, a
build path or an internal size, logging a few KB at most; and another tenant's requests
are answered meanwhile.

Before, a 51 KB draft-04 `enum` of objects held the event loop (and every tenant's stream)
for 36 s and then answered 500; a pattern, a recursive `$ref`, a huge number or deep nesting
were 500s; `{"$ref": "#"}` answered 200 with empty content; a 15,000-property schema's 400
quoted a Rust panic.
"""

import concurrent.futures
import time

import pytest

from tests.clients import chat, http
from tests.inference.conftest import BASE_NAME, LiveServer, start_server, stop_server

pytestmark = pytest.mark.django_db
DRAFT_04 = "http://json-schema.org/draft-04/schema#"
FORMAT_PARAM = "response_format.json_schema.schema"
LOG_BYTES_PER_REFUSAL = 4096


def response_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def nested(levels: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def tool(i: int, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": f"tool_{i}", "parameters": parameters}}


ATTACKS = {
    "draft04_enum_of_4000_objects": (
        {"$schema": DRAFT_04, "enum": [{"k": i} for i in range(4000)]},
        "enum values",
    ),
    "enum_of_2100_objects": ({"enum": [{"k": i} for i in range(2100)]}, "enum values"),
    "10000_properties": (
        {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(10000)}},
        "bytes",  # 260 KB of schema: the size bound comes first
    ),
    "1500_properties": (
        {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1500)}},
        "properties",
    ),
    "1000_anyof_branches": (
        {"anyOf": [{"type": "object", "required": [f"k{i}"]} for i in range(1000)]},
        "anyOf branches",
    ),
    "pattern_repeated_a_million_times": (
        {"type": "string", "pattern": "^a{1000000}$"},
        "repeat at most",
    ),
    "recursive_required_ref": (
        {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
        "no finite JSON value",
    ),
    "ref_to_itself": ({"$ref": "#"}, "no finite JSON value"),
    "minimum_of_10_to_the_300": ({"type": "number", "minimum": 10**300}, "in magnitude"),
    "objects_nested_100_levels": (nested(100), "nests deeper"),
}


@pytest.fixture(scope="module")
def server(serve_data):
    # The default body limit (1 MiB), so the schemas reach the parser.
    url, proc, log = start_server(
        serve_data["tmp"], {"LORAPLEX_MAX_REQUEST_BYTES": str(1024 * 1024)}
    )
    key_a, key_b, key_a_ro = serve_data["keys"]
    yield LiveServer(
        url, key_a, key_b, key_a_ro, serve_data["adapter_dir"], serve_data["base_dir"], proc, log
    )
    stop_server(proc)


def assert_plain_400(response, param: str, words: str) -> None:
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert error["param"] == param, error
    assert words in error["message"], error["message"]
    for internal in ("panicked", ".rs:", "Traceback", "backtrace", "/home/", "/root/"):
        assert internal not in error["message"], error["message"]
    assert len(error["message"]) < 600, error["message"]


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("stream", [False, True])
def test_a_hostile_response_format_is_a_plain_400_before_any_stream(server, attack, stream):
    schema, words = ATTACKS[attack]
    before = server.log.stat().st_size
    response = chat(
        server,
        server.key_a,
        model=BASE_NAME,
        max_tokens=4,
        stream=stream,
        response_format=response_format(schema),
    )
    assert response.headers["content-type"].startswith("application/json")  # not a stream
    assert_plain_400(response, FORMAT_PARAM, words)
    assert server.log.stat().st_size - before < LOG_BYTES_PER_REFUSAL


def test_hostile_tool_parameters_name_the_tool_that_crossed_the_bound(server):
    objects = {"type": "object", "properties": {"x": {"enum": [{"v": i} for i in range(120)]}}}
    tools = [tool(i, objects) for i in range(4)]
    response = chat(server, server.key_a, model=BASE_NAME, max_tokens=4, tools=tools)
    # 128 structured enum values in all: the second tool's brings the request past them
    assert_plain_400(response, "tools[1].function.parameters", "objects or arrays")


def test_a_request_full_of_hostile_schemas_does_not_hold_up_another_tenant(server):
    """The checks are linear and off the event loop: while eight hostile requests are
    refused, tenant B's chat and the health probe are answered."""
    schema = ATTACKS["draft04_enum_of_4000_objects"][0]
    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        hostile = [
            pool.submit(
                chat,
                server,
                server.key_a,
                model=BASE_NAME,
                max_tokens=4,
                response_format=response_format(schema),
            )
            for _ in range(8)
        ]
        started = time.monotonic()
        other = pool.submit(chat, server, server.key_b, model=BASE_NAME)
        assert http(server, "GET", "/healthz").status_code == 200
        assert other.result().status_code == 200
        answered_in = time.monotonic() - started
        for refused in hostile:
            assert refused.result().status_code == 400
    # A hang guard, not a tuned deadline: before, the loop was held for 36 s per request.
    assert answered_in < 30
