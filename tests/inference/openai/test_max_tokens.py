"""max_tokens has a per-deployment default and cap (inference/openai/max_tokens.py).

Before, a chat request without `max_tokens` generated to the end of the context whenever the
model did not stop (8,000 tokens, minutes of CPU), and nothing bounded one that asked.
LORAPLEX_DEFAULT_MAX_TOKENS is what a request without one gets (within the cap and the
room the prompt leaves); LORAPLEX_MAX_TOKENS_CAP refuses more, with a 400 naming the field.
"""

import httpx
import pytest

from inference.errors import ProtocolError
from inference.openai.max_tokens import max_tokens_for
from platform_site.checks import max_tokens_limits
from tests.inference.conftest import BASE_NAME, start_server, stop_server

DEFAULT, CAP = 5, 24  # the live server's
QUESTION = [{"role": "user", "content": "Say something."}]


@pytest.mark.parametrize(
    "default, cap, room, expected",
    [
        (1024, 0, 400, 400),  # the room the prompt leaves bounds the default
        (1024, 0, 5000, 1024),
        (1024, 64, 5000, 64),  # so does the cap
        (0, 0, 5000, 5000),  # no default: the end of the context, as before
        (0, 64, 5000, 64),
    ],
)
def test_a_request_without_max_tokens_gets_the_default(settings, default, cap, room, expected):
    settings.DEFAULT_MAX_TOKENS, settings.MAX_TOKENS_CAP = default, cap
    assert max_tokens_for(None, "max_tokens", room) == expected


def test_a_request_may_ask_up_to_the_cap_and_is_refused_past_it(settings):
    settings.DEFAULT_MAX_TOKENS, settings.MAX_TOKENS_CAP = 16, 64
    assert max_tokens_for(64, "max_tokens", 5000) == 64
    with pytest.raises(ProtocolError) as caught:
        max_tokens_for(65, "max_completion_tokens", 5000)
    error = caught.value
    assert (error.status, error.param) == (400, "max_completion_tokens")
    assert "64" in error.message and "LORAPLEX_MAX_TOKENS_CAP" in error.message


def test_without_a_cap_what_is_asked_is_left_to_the_context_check(settings):
    settings.MAX_TOKENS_CAP = 0
    assert max_tokens_for(100_000, "max_tokens", 400) == 100_000  # prepare refuses it after


@pytest.mark.parametrize(
    "default, cap, ids",
    [
        (1024, 0, []),
        (0, 16, []),
        (-1, 0, ["loraplex.E020"]),
        (16, -5, ["loraplex.E020"]),
        (1024, 8, ["loraplex.E021"]),  # /v1/completions' own default of 16 would be refused
    ],
)
def test_the_settings_are_checked_at_start_up(settings, default, cap, ids):
    settings.DEFAULT_MAX_TOKENS, settings.MAX_TOKENS_CAP = default, cap
    assert [error.id for error in max_tokens_limits(None)] == ids


@pytest.fixture(scope="module")
def server(serve_data):
    url, proc, _ = start_server(
        serve_data["tmp"],
        {"LORAPLEX_DEFAULT_MAX_TOKENS": str(DEFAULT), "LORAPLEX_MAX_TOKENS_CAP": str(CAP)},
    )
    yield url, serve_data["keys"][0]
    stop_server(proc)


def post(server, path: str, body: dict) -> httpx.Response:
    url, key = server
    body = {"model": BASE_NAME, "ignore_eos": True, **body}  # no early stop: the bound shows
    return httpx.post(
        f"{url}/v1/{path}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )


@pytest.mark.django_db
def test_the_live_default_and_cap(server):
    chat = post(server, "chat/completions", {"messages": QUESTION})
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["completion_tokens"] == DEFAULT
    assert chat.json()["choices"][0]["finish_reason"] == "length"
    text = post(server, "completions", {"prompt": "Once upon"})
    assert text.json()["usage"]["completion_tokens"] == 16  # OpenAI's default for completions
    null = post(server, "completions", {"prompt": "Once upon", "max_tokens": None})
    assert null.json()["usage"]["completion_tokens"] == DEFAULT
    at_cap = post(server, "chat/completions", {"messages": QUESTION, "max_tokens": CAP})
    assert at_cap.json()["usage"]["completion_tokens"] == CAP
    for path, body, param in [
        ("chat/completions", {"messages": QUESTION, "max_tokens": CAP + 1}, "max_tokens"),
        (
            "chat/completions",
            {"messages": QUESTION, "max_completion_tokens": 10**6},
            "max_completion_tokens",
        ),
        ("completions", {"prompt": "Once upon", "max_tokens": CAP + 1}, "max_tokens"),
    ]:
        refused = post(server, path, body)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "invalid_request"
        assert error["param"] == param
        assert "LORAPLEX_MAX_TOKENS_CAP" in error["message"]
    assert post(server, "chat/completions", {"messages": QUESTION}).status_code == 200
