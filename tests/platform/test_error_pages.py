"""What no view answers (platform_site/error_pages.py): under /v1/ and /api/ it is JSON in
OpenAI's error shape, elsewhere the web's HTML page.

Before: an unknown /v1/ or /api/ path was the web's HTML 404, a bad Host header an HTML 400,
a failing middleware an HTML 500, `POST /healthz` Django's HTML CSRF page (an empty 405 once
past it), and `POST /api/v1/adapters` (no trailing slash) an empty 301 to the slashed path.
"""

import json
import re

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.sessions.middleware import SessionMiddleware
from django.core.exceptions import PermissionDenied
from django.middleware.csrf import CsrfViewMiddleware
from django.test import AsyncClient, Client, RequestFactory
from django.utils.module_loading import import_string

from platform_site.api_paths import is_api_path
from platform_site.error_pages import csrf_failure

pytestmark = pytest.mark.django_db
ERROR_KEYS = {"message", "type", "param", "code"}


def json_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json"
    error = json.loads(response.content)["error"]
    assert set(error) == ERROR_KEYS and error["code"] == code
    return error


@pytest.mark.parametrize(
    "method, path",
    [
        ("get", "/v1/no-such-endpoint"),
        ("post", "/v1/chat/completions/extra"),
        ("get", "/v1"),
        ("get", "/v1/"),
        ("delete", "/api/v1/no-such-collection/"),
        ("get", "/api/"),
        ("get", "/api"),
    ],
)
def test_an_unknown_api_path_is_a_json_404_naming_it(method, path):
    error = json_error(getattr(Client(), method)(path), 404, "unknown_path")
    assert f"{method.upper()} {path}" in error["message"] and error["param"] is None
    assert error["type"] == "not_found_error"


@pytest.mark.parametrize(
    "method, path, twin",
    [
        ("post", "/api/v1/adapters", "/api/v1/adapters/"),
        ("get", "/api/v1/adapters", "/api/v1/adapters/"),
        ("get", "/v1/models/", "/v1/models"),
    ],
)
def test_an_api_path_off_by_a_slash_is_not_redirected_but_named(method, path, twin):
    """Django's slash redirect (a 301 with an empty body) would turn a POST into a GET."""
    error = json_error(getattr(Client(), method)(path), 404, "unknown_path")
    assert f"did you mean {twin} ?" in error["message"]


def test_a_web_path_off_by_a_slash_is_still_redirected():
    response = Client().get("/keys")
    assert response.status_code == 301 and response["Location"] == "/keys/"


def test_a_long_unknown_path_is_not_echoed_whole():
    error = json_error(Client().get("/v1/" + "x" * 10_000), 404, "unknown_path")
    assert len(error["message"]) < 400


def test_an_unknown_web_path_is_still_the_html_page():
    response = Client().get("/no-such-page/")
    assert response.status_code == 404 and b"Not found" in response.content
    assert response["Content-Type"].startswith("text/html")


def test_a_bad_host_header_is_a_json_400_that_keeps_the_hint_to_the_log():
    response = Client(HTTP_HOST="evil.example").get("/v1/models")
    error = json_error(response, 400, "invalid_request")
    assert "evil.example" not in error["message"] and "ALLOWED_HOSTS" not in error["message"]
    html = Client(HTTP_HOST="evil.example").get("/login/")
    assert html.status_code == 400 and not html["Content-Type"].startswith("application/json")


def broken_sessions(self, request):
    raise RuntimeError("the session store caught fire")


def test_a_failing_middleware_is_a_json_500_with_a_logged_id(monkeypatch, caplog):
    monkeypatch.setattr(SessionMiddleware, "process_request", broken_sessions)
    client = Client(raise_request_exception=False)
    error = json_error(client.get("/api/v1/adapters/"), 500, "internal_error")
    error_id = re.search(r"\(error id ([0-9a-f]{32})\)", error["message"])[1]
    assert "caught fire" not in error["message"]
    logged = [r for r in caplog.records if error_id in r.getMessage()]
    assert logged and "caught fire" in logged[0].getMessage()  # with its traceback
    web = client.get("/login/")
    assert web.status_code == 500 and not web["Content-Type"].startswith("application/json")


def test_under_asgi_too_the_id_is_logged_with_the_traceback(monkeypatch, caplog):
    """Django answers an exception raised in its async request path (here by a middleware's
    process_view) in a worker thread: the exception must still reach the log with the id."""

    def broken(self, request, view, args, kwargs):
        raise RuntimeError("the CSRF check caught fire")

    monkeypatch.setattr(CsrfViewMiddleware, "process_view", broken)
    response = async_to_sync(AsyncClient(raise_request_exception=False).get)("/v1/models")
    error = json_error(response, 500, "internal_error")
    error_id = re.search(r"\(error id ([0-9a-f]{32})\)", error["message"])[1]
    logged = [r for r in caplog.records if error_id in r.getMessage()]
    assert logged and "CSRF check caught fire" in logged[0].getMessage()


def test_a_middleware_refusal_is_a_json_403(monkeypatch):
    def refuse(self, request):
        raise PermissionDenied("No.")

    monkeypatch.setattr(SessionMiddleware, "process_request", refuse)
    json_error(Client().get("/v1/models"), 403, "insufficient_permissions")


def test_a_csrf_failure_on_an_api_path_is_json():
    """Every API view is CSRF-exempt (inference/auth.py and DRF check sessions themselves),
    so Django's CSRF check reaches none today; its failure view answers JSON there all the
    same, should one ever be added without the exemption."""
    assert import_string(settings.CSRF_FAILURE_VIEW) is csrf_failure
    answer = csrf_failure(RequestFactory().post("/v1/models"), reason="CSRF cookie not set")
    error = json_error(answer, 403, "csrf_failed")
    assert "CSRF cookie not set" in error["message"]
    assert csrf_failure(RequestFactory().post("/login/"), reason="x").status_code == 403


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_the_probes_answer_a_wrong_method_in_json_without_a_csrf_check(path):
    response = Client(enforce_csrf_checks=True).post(path, data=b"x", content_type="text/plain")
    json_error(response, 405, "method_not_allowed")
    assert response["Allow"] == "GET"


def test_the_api_paths():
    assert all(map(is_api_path, ["/v1", "/v1/", "/v1/models", "/api", "/api/v1/keys/"]))
    assert not any(map(is_api_path, ["/", "/v1x", "/apiary/", "/login/", "/healthz"]))
