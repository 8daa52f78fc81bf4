"""An error's `param` is a string path to the field at fault (`scopes[1]`, `d.a`) or null,
never a bare list index: OpenAI's clients read it as a string.

DRF keys a list field's item errors by their index and a dict field's by their key; the
translation (platform_site/error_responses.py) turns that nesting into one path. Then many
bad requests across the REST API and the /v1 API, each answered with a 4xx whose `param`
is a string or null.
"""

import pytest
from django.test import Client
from rest_framework import exceptions as drf
from rest_framework import serializers

from platform_site.error_responses import to_api_error
from tests.registry.conftest import (  # noqa: F401 (fixtures)
    adapter,
    base_model,
    good_adapter_dir,
    registry_settings,
    tiny_base_dir,
)

pytestmark = pytest.mark.django_db


class Item(serializers.Serializer):
    name = serializers.CharField()


class Body(serializers.Serializer):
    scopes = serializers.ListField(child=serializers.ChoiceField(["inference", "registry:read"]))
    weights = serializers.DictField(child=serializers.IntegerField(), required=False)
    items = Item(many=True, required=False)
    nested = Item(required=False)
    grid = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField()), required=False
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"scopes": ["inference", "admin"]}, "scopes[1]"),
        ({"scopes": ["inference"], "weights": {"a": "x"}}, "weights.a"),
        ({"scopes": ["inference"], "items": [{"name": "a"}, {}]}, "items[1].name"),
        ({"scopes": ["inference"], "nested": {}}, "nested.name"),
        ({"scopes": ["inference"], "grid": [[1], [2, "x"]]}, "grid[1][1]"),
        ({}, "scopes"),
    ],
)
def test_a_validation_error_names_the_path_to_the_field(body, param):
    checked = Body(data=body)
    assert not checked.is_valid()
    error = to_api_error(drf.ValidationError(checked.errors))
    assert error.param == param
    assert error.message.startswith(f"{param}: ")


def test_errors_of_the_whole_object_name_no_field():
    error = to_api_error(drf.ValidationError({"non_field_errors": ["start must be before end."]}))
    assert error.param is None and error.message == "start must be before end."
    nested = to_api_error(drf.ValidationError({"nested": {"non_field_errors": ["Bad pair."]}}))
    assert nested.param == "nested" and nested.message == "nested: Bad pair."


def test_a_key_with_an_unknown_scope_names_that_scope_by_its_position(
    tenant_a, make_key, key_client
):
    _, key = make_key(tenant_a)
    response = key_client(key).post(
        "/api/v1/keys/", {"name": "ci", "scopes": ["inference", "admin"]}, format="json"
    )
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["param"] == "scopes[1]" and error["code"] == "invalid_request"
    assert '"admin"' in error["message"]


# (method, path, JSON body or query) that a caller could send by mistake; `adapter` is
# support-bot (tenant A's) and `number` its version 1, which does not exist here.
REST_MISTAKES = [
    ("post", "/api/v1/keys/", {"name": "ci", "scopes": ["inference", "admin"]}),
    ("post", "/api/v1/keys/", {"name": "ci", "scopes": [[]]}),
    ("post", "/api/v1/keys/", {"name": "ci", "scopes": {"a": 1}}),
    ("post", "/api/v1/keys/", {"name": "ci", "scopes": []}),
    ("post", "/api/v1/keys/", {"name": "", "scopes": ["inference"], "expires_in_days": 0}),
    ("post", "/api/v1/keys/", [{"name": "ci"}]),
    ("post", "/api/v1/keys/", "just a string"),
    ("get", "/api/v1/keys/999999/", None),
    ("delete", "/api/v1/keys/999999/", None),
    ("post", "/api/v1/adapters/", {"name": "Not A Slug!"}),
    ("post", "/api/v1/adapters/", {"name": ["a"], "description": {"x": 1}}),
    ("post", "/api/v1/adapters/", {"name": "bot", "base_model": "no-such-base"}),
    ("post", "/api/v1/adapters/", {"name": "support-bot"}),
    ("patch", "/api/v1/adapters/support-bot/", {"description": ["a", "b"]}),
    ("patch", "/api/v1/adapters/support-bot/", {"description": "x" * 3000}),
    ("get", "/api/v1/adapters/no-such-bot/", None),
    ("post", "/api/v1/adapters/support-bot/versions/", {"source": 7}),
    ("post", "/api/v1/adapters/support-bot/versions/", {"source": "file:///etc/passwd"}),
    ("post", "/api/v1/adapters/support-bot/versions/", {}),
    ("get", "/api/v1/adapters/support-bot/versions/9/", None),
    ("put", "/api/v1/adapters/support-bot/aliases/production/", {"version": 0}),
    ("put", "/api/v1/adapters/support-bot/aliases/production/", {"version": [1]}),
    ("put", "/api/v1/adapters/support-bot/aliases/production/", {"version": 9}),
    ("put", "/api/v1/adapters/support-bot/aliases/canary/", {"version": 1, "weight": 101}),
    ("put", "/api/v1/adapters/support-bot/aliases/Bad Alias/", {"version": 1}),
    ("delete", "/api/v1/adapters/support-bot/aliases/nope/", None),
    ("put", "/api/v1/adapters/support-bot/eval-set/", {"file": "not a file"}),
    ("get", "/api/v1/audit/", {"limit": 0}),
    ("get", "/api/v1/audit/", {"limit": "many", "verb": "x" * 100}),
    ("get", "/api/v1/usage/", {"group_by": "planet"}),
    ("get", "/api/v1/usage/", {"start": "2026-02-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"}),
    ("get", "/api/v1/usage/", {"start": "yesterday"}),
    ("post", "/api/v1/base-models/", {}),
]


def assert_a_4xx_with_a_string_param(response) -> dict:
    assert 400 <= response.status_code < 500, (response.status_code, response.content)
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["param"] is None or isinstance(error["param"], str), error
    return error


@pytest.mark.parametrize(("method", "path", "body"), REST_MISTAKES)
def test_every_rest_refusal_names_a_string_param_or_none(
    tenant_a,
    make_key,
    key_client,
    adapter,  # noqa: F811
    method,
    path,
    body,
):
    _, key = make_key(tenant_a)
    client = key_client(key)
    if method == "get":
        response = client.get(path, body or {})
    else:
        response = getattr(client, method)(path, body, format="json")
    assert_a_4xx_with_a_string_param(response)


# /v1 bodies refused while they are read, before any engine is asked.
V1_MISTAKES = [
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "robot", "content": "x"}]}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user"}], "n": "two"}),
    ("/v1/chat/completions", {"model": "m", "messages": [], "tools": [{"type": "function"}]}),
    ("/v1/chat/completions", {"model": ["m"], "messages": "hi"}),
    ("/v1/chat/completions", [1, 2, 3]),
    ("/v1/completions", {"model": "m", "prompt": [[1, "x"]]}),
    ("/v1/completions", {"model": "m", "prompt": "x", "logit_bias": {"a": 1}}),
    ("/v1/completions", {"model": "m", "prompt": "x", "stop": [1]}),
    ("/v1/responses", {"model": "m", "input": [{"type": "nonsense"}]}),
    ("/v1/responses", {"model": "m", "input": "x", "tools": [{"type": "function"}]}),
    ("/v1/embeddings", {"model": "m", "input": "x"}),
    ("/tokenize", {"model": "m", "prompt": 5}),
    ("/detokenize", {"model": "m", "tokens": ["a"]}),
    ("/v1/load_lora_adapter", {"lora_name": 5}),
]


@pytest.mark.parametrize(("path", "body"), V1_MISTAKES)
def test_every_v1_refusal_names_a_string_param_or_none(tenant_a, make_key, path, body):
    _, key = make_key(tenant_a)
    response = Client().post(
        path, body, content_type="application/json", headers={"Authorization": f"Bearer {key}"}
    )
    assert_a_4xx_with_a_string_param(response)
