"""One mapping, two transports: the REST API (DRF) and the async /v1 views answer alike, and
an exception nobody expected is a 500 whose id is in the log next to its traceback."""

import json
import logging
import re

import pytest
from django.core.exceptions import BadRequest, DisallowedHost
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from django.test import Client
from rest_framework import exceptions as drf

from inference.engine import AdapterLoadError, EngineError, PromptTooLongError
from inference.errors import RateLimited
from platform_site.error_responses import (
    error_body,
    json_error_response,
    openai_exception_handler,
    to_api_error,
)
from platform_site.errors import ApiError
from tenants.keyauth import NO_CREDENTIALS, MissingApiKey

pytestmark = pytest.mark.django_db


def fail(*args, **kwargs):
    raise RuntimeError("the disk caught fire at /srv/secret")


def assert_logged_internal_error(response, caplog):
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "internal_error" and error["type"] == "api_error"
    error_id = re.search(r"\(error id ([0-9a-f]{32})\)", error["message"])[1]
    assert "caught fire" not in error["message"]  # details go to the log, not to the caller
    logged = [r for r in caplog.records if error_id in r.getMessage()]
    assert logged and "caught fire" in logged[0].getMessage()  # with its traceback


def test_an_unexpected_error_in_a_rest_view_is_a_json_500_with_a_logged_id(
    tenant_a, make_key, key_client, monkeypatch, caplog
):
    _, key = make_key(tenant_a)
    monkeypatch.setattr("registry.selectors.base_model_list", fail)
    assert_logged_internal_error(key_client(key).get("/api/v1/base-models/"), caplog)


def test_an_unexpected_error_in_an_async_view_is_a_json_500_with_a_logged_id(
    tenant_a, make_key, monkeypatch, caplog
):
    _, key = make_key(tenant_a)
    monkeypatch.setattr("inference.openai.views.models_for_tenant", fail)
    response = Client().get("/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert_logged_internal_error(response, caplog)


def test_both_transports_answer_an_error_the_same_way():
    error = RateLimited("Slow down.", retry_after=7)
    drf_answer = openai_exception_handler(error, {})
    async_answer = json_error_response(error)
    assert drf_answer.status_code == async_answer.status_code == 429
    assert (
        json.loads(drf_answer.content)
        == json.loads(async_answer.content)
        == error_body(error)
        == {
            "error": {
                "message": "Slow down.",
                "type": "rate_limit_error",
                "param": None,  # OpenAI's schema requires it, null allowed
                "code": "rate_limit_exceeded",
            }
        }
    )
    assert drf_answer["Retry-After"] == async_answer["Retry-After"] == "7"


def test_a_rest_error_is_json_whatever_the_client_accepts(tenant_a, make_key, key_client):
    """DRF renders with the renderer the request negotiated: the browsable API's HTML for a
    browser, YAML on the schema view. An error is JSON in OpenAI's shape all the same."""
    _, key = make_key(tenant_a)
    client = key_client(key)
    for accept, status, code in [
        ("text/html", 404, "not_found"),  # a browser: the browsable API renders successes
        ("application/xml", 406, "not_acceptable"),  # no renderer at all
    ]:
        response = client.get("/api/v1/adapters/no-such-adapter/", headers={"Accept": accept})
        assert response.status_code == status, accept
        assert response["Content-Type"] == "application/json"
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == code
    refused = Client().post("/api/schema/")  # the schema view renders YAML
    assert refused["Content-Type"] == "application/json"
    assert refused.json()["error"]["code"] == "method_not_allowed"


def test_a_401_names_the_bearer_scheme_in_both_transports():
    error = MissingApiKey("No credentials.")
    for answer in (openai_exception_handler(error, {}), json_error_response(error)):
        assert answer.status_code == 401 and answer["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "exc, status, code, param",
    [
        (PromptTooLongError("too long"), 400, "context_length_exceeded", "messages"),
        (AdapterLoadError("refused by the PEFT rules"), 503, "adapter_unavailable", None),
        (EngineError("bad token id"), 400, "invalid_request", None),
        (drf.NotAuthenticated(), 401, "missing_api_key", None),
        (
            drf.ValidationError({"weight": ["Ensure this value is at most 100."]}),
            400,
            "invalid_request",
            "weight",
        ),
        (DjangoValidationError({"name": ["Too long."]}), 400, "invalid_request", "name"),
        (drf.ParseError("JSON parse error"), 400, "parse_error", None),
        (drf.Throttled(wait=3), 429, "invalid_request", None),  # not in the table, still a 4xx
        (KeyError("surprise"), 500, "internal_error", None),
        (BadRequest("The form is malformed."), 400, "invalid_request", None),
        (DisallowedHost("Invalid HTTP_HOST header: 'evil.example'."), 400, "invalid_request", None),
    ],
)
def test_the_one_mapping(exc, status, code, param):
    error = to_api_error(exc)
    assert isinstance(error, ApiError)
    assert (error.status, error.code, error.param) == (status, code, param)


def test_a_field_error_names_the_field_in_its_message():
    error = to_api_error(drf.ValidationError({"limit": ["Ensure this value is at most 1000."]}))
    assert error.message == "limit: Ensure this value is at most 1000."


def test_an_api_error_passes_through_unchanged():
    error = MissingApiKey("No credentials.")
    assert to_api_error(error) is error


def test_framework_errors_that_say_too_little_or_too_much_get_our_words():
    assert to_api_error(drf.NotAuthenticated()).message == NO_CREDENTIALS
    assert to_api_error(Http404("No Adapter matches the given query.")).message == "Not found."
    assert "ALLOWED_HOSTS" not in to_api_error(DisallowedHost("add it to ALLOWED_HOSTS")).message
    assert to_api_error(BadRequest("The form is malformed.")).message == "The form is malformed."


def test_an_internal_error_logs_a_few_kb_whatever_its_message_quotes(caplog):
    """An exception can quote a request body or a compiled grammar whole: its log record is
    cut to a few KB, the error id kept to join it with the answer."""
    huge = RuntimeError("grammar: " + "x" * 5_000_000)
    with caplog.at_level(logging.ERROR, logger="platform_site.error_responses"):
        error = to_api_error(huge)
    error_id = re.search(r"\(error id ([0-9a-f]{32})\)", error.message)[1]
    (record,) = [r for r in caplog.records if error_id in r.getMessage()]
    assert "RuntimeError: grammar: xxx" in record.getMessage()
    assert len(record.getMessage()) < 10_000 and record.exc_info is None
