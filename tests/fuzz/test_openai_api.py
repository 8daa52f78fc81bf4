"""Fuzzing the /v1 endpoints (OpenAI-compatible and operators) from their OpenAPI description
(inference/openapi.py) against a live `manage.py serve` with the tiny model: no 5xx.

Generation is real, so a hook caps `max_tokens` to a few tokens (the fuzzer explores the
parameters, not the model's speed) and names tenant A's models in most requests.
"""

import json
import zlib

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from tests.fuzz.checks import error_param_is_a_string_or_null
from tests.fuzz.conftest import CONFIG, SCHEMA
from tests.inference.conftest import BASE_NAME, start_server, stop_server

# The server reads rows committed by serve_data (tests/inference/conftest.py).
pytestmark = pytest.mark.django_db
OPERATOR_TOKEN = "fuzz-operator-token"
MAX_FUZZ_TOKENS = 4
GENERATION_PATHS = {"/v1/chat/completions", "/v1/completions", "/v1/responses"}
TOKENIZER_PATHS = {"/tokenize", "/detokenize"}
OPERATOR_PATHS = {
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/v1/pin_lora_adapter",
    "/v1/unpin_lora_adapter",
    "/v1/lora_adapters",
}
# Called over HTTP (no app): the schema's WSGI app has no engine. vLLM's tokenizer endpoints
# sit at the root, beside /v1.
V1 = schemathesis.openapi.from_dict(
    SCHEMA.raw_schema, config=schemathesis.Config.from_dict(CONFIG)
).include(path_regex="^/(v1/|tokenize$|detokenize$)")


# The names tenant A may use; a generated `model` string is mostly swapped for one of them
# (deterministically), so requests reach resolution, tokenizing and the engine, not only 404.
MODELS = [BASE_NAME, "pirate", "pirate@production", "pirate:1"]


@schemathesis.hook
def before_call(context, case, kwargs):
    """Generation (and tokenizer) requests name a real model most of the time, and
    generation asks for few tokens."""
    if case.path not in GENERATION_PATHS | TOKENIZER_PATHS or not isinstance(case.body, dict):
        return
    body = case.body
    model = body.get("model")
    if isinstance(model, str):
        seen = json.dumps(body, sort_keys=True, default=repr).encode(errors="replace")
        pick = zlib.crc32(seen) % (len(MODELS) + 1)
        body["model"] = MODELS[pick] if pick < len(MODELS) else model
    if case.path in TOKENIZER_PATHS:
        return
    names = ("max_tokens", "max_completion_tokens")
    if case.path == "/v1/responses":
        names = ("max_output_tokens",)
    for name in names:
        value = body.get(name)
        if value is None and name in body:
            body[name] = MAX_FUZZ_TOKENS  # null means the deployment default (1024 tokens)
        elif isinstance(value, int) and not isinstance(value, bool) and value > MAX_FUZZ_TOKENS:
            body[name] = MAX_FUZZ_TOKENS
    if not any(name in body for name in names):
        body[names[0]] = MAX_FUZZ_TOKENS


@pytest.fixture(scope="module")
def fuzz_server(serve_data):
    url, proc, log = start_server(serve_data["tmp"], {"LORAPLEX_OPERATOR_TOKEN": OPERATOR_TOKEN})
    yield url, serve_data["keys"][0]
    stop_server(proc)
    assert "Traceback" not in log.read_text(), log.read_text()[-4000:]


@V1.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_no_v1_request_is_answered_with_a_server_error(case, fuzz_server):
    url, key = fuzz_server
    token = OPERATOR_TOKEN if case.path in OPERATOR_PATHS else key
    case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}
    case.call_and_validate(
        base_url=url, checks=[not_a_server_error, error_param_is_a_string_or_null], timeout=60
    )
