"""An answer's size is known before generation: one that would run past the deployment's
limit (the prompt's logprobs repeated in every choice of a completion, or many choices of
top logprobs) is a 400 naming the parameter to lower, and the engine never sees it.

Before, `/v1/completions` with an 8k-token prompt, `prompt_logprobs: 20` and `n: 16` (a 32 KB
request) answered 205 MB, and writing it held the event loop for 8 s. The tiny model's
context is 512 tokens, so this server's limit is 20,000 entries instead of 200,000.
"""

import pytest

from tests.clients import http
from tests.inference.conftest import BASE_NAME, LiveServer, start_server, stop_server

pytestmark = pytest.mark.django_db
LIMIT = 20_000
PROMPT = [t % 380 + 1 for t in range(300)]  # token ids of the tiny model's vocabulary


@pytest.fixture(scope="module")
def server(serve_data):
    url, proc, log = start_server(serve_data["tmp"], {"LORAPLEX_MAX_LOGPROB_ENTRIES": str(LIMIT)})
    key_a, key_b, key_a_ro = serve_data["keys"]
    yield LiveServer(
        url, key_a, key_b, key_a_ro, serve_data["adapter_dir"], serve_data["base_dir"], proc, log
    )
    stop_server(proc)


def complete(server, **body):
    payload = {"model": BASE_NAME, "prompt": PROMPT, "max_tokens": 2, **body}
    return http(server, "POST", "/v1/completions", key=server.key_a, json=payload)


def assert_refused(response, param: str, lower: str) -> None:
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["param"] == param
    assert "LORAPLEX_MAX_LOGPROB_ENTRIES" in error["message"]
    assert f"Lower {param}, n or {lower}" in error["message"]


def test_prompt_logprobs_repeated_in_every_choice_past_the_limit_is_refused(server):
    # 300 prompt tokens x (1 + 20): 6,300 entries once, 25,200 in four choices
    assert complete(server, prompt_logprobs=20, n=3).status_code == 200
    assert_refused(complete(server, prompt_logprobs=20, n=4), "prompt_logprobs", "max_tokens")


def test_a_chat_counts_the_prompt_logprobs_once(server):
    """A chat answer carries them once, beside the choices (vLLM's shape): 190 prompt tokens
    x 21 entries is within the limit, though 16 copies would not be."""
    body = {
        "model": BASE_NAME,
        "messages": [{"role": "user", "content": "Hi " * 60}],
        "max_tokens": 2,
        "n": 16,
        "prompt_logprobs": 20,
    }
    response = http(server, "POST", "/v1/chat/completions", key=server.key_a, json=body)
    assert response.status_code == 200, response.text[:300]


def test_generated_logprobs_past_the_limit_name_the_chat_field(server):
    body = {
        "model": BASE_NAME,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 100,
        "n": 10,  # 10 choices x 100 tokens x (1 + 20) = 21,000 entries
        "logprobs": True,
        "top_logprobs": 20,
    }
    response = http(server, "POST", "/v1/chat/completions", key=server.key_a, json=body)
    assert_refused(response, "top_logprobs", "max_tokens")
    assert complete(server, n=10, logprobs=20, max_tokens=90).status_code == 200


def test_a_batch_is_counted_as_a_whole(server):
    """Every prompt of a batch adds its own: 300 x 21 entries each, four prompts past the
    limit though each alone is far within it."""
    assert complete(server, prompt=[PROMPT] * 3, prompt_logprobs=20).status_code == 200
    response = complete(server, prompt=[PROMPT] * 4, prompt_logprobs=20)
    assert_refused(response, "prompt_logprobs", "max_tokens")
    assert "in 4 prompts" in response.json()["error"]["message"]


def test_an_echo_counts_the_prompt_tokens_in_every_choice(server):
    # (300 prompt + 2 generated tokens) x (1 + 20) per choice: 19,026 in three, 25,368 in four
    assert complete(server, echo=True, logprobs=20, n=3).status_code == 200
    assert_refused(complete(server, echo=True, logprobs=20, n=4), "logprobs", "max_tokens")
