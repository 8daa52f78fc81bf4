"""Calling a live `serve` (or the router in front of replicas) over HTTP, as clients do.

`via` is where to send: a base URL, a live server (anything with a `url`, such as
tests/inference/conftest.py's LiveServer), or an `httpx.Client` with a `base_url` (a
signed-in browser session, whose cookies authenticate it). Modules bind the
fields all their requests share with `functools.partial`, e.g.
`chat = partial(openai_chat, messages=QUESTION, temperature=0)`.
"""

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import openai

HI = [{"role": "user", "content": "Hi"}]
# Seconds for an answer: a loaded machine is slow, and only a hang should time out.
TIMEOUT = 60


def url_of(via) -> str:
    return via if isinstance(via, str) else via.url


def http(via, method: str, path: str, *, key: str | None = None, **kwargs) -> httpx.Response:
    """`method path` with `key` as the Bearer token (none without one)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    kwargs["headers"] = headers | (kwargs.get("headers") or {})
    kwargs.setdefault("timeout", TIMEOUT)
    if isinstance(via, httpx.Client):
        return via.request(method, path, **kwargs)
    return httpx.request(method, f"{url_of(via)}{path}", **kwargs)


def chat(
    via, key: str | None = None, *, model: str, messages=HI, max_tokens: int = 4, **body
) -> httpx.Response:
    """POST /v1/chat/completions: `messages` (a short question), `max_tokens`, and `body`'s
    other fields; `headers=` adds to the key's, `timeout=` replaces TIMEOUT."""
    sending = {name: body.pop(name) for name in ("headers", "timeout") if name in body}
    payload = {"model": model, "messages": messages, "max_tokens": max_tokens, **body}
    return http(via, "POST", "/v1/chat/completions", key=key, json=payload, **sending)


@contextmanager
def chat_stream(
    via, key: str, *, model: str, messages=HI, max_tokens: int = 400, **body
) -> Iterator[httpx.Response]:
    """A streamed chat completion, open for the `with` block: by default a long one (past
    any end-of-sequence token), for tests that act while it runs."""
    payload = {"model": model, "messages": messages, "max_tokens": max_tokens}
    payload |= {"ignore_eos": True, **body, "stream": True}
    with httpx.stream(
        "POST",
        f"{url_of(via)}/v1/chat/completions",
        json=payload,
        headers={"Authorization": f"Bearer {key}"},
        timeout=TIMEOUT,
    ) as response:
        yield response


def openai_chat(via, model: str, **create):
    """`chat.completions.create` through the official client: `via` an `openai.OpenAI`, or a
    live server (its client, with tenant A's key)."""
    api = via if isinstance(via, openai.OpenAI) else via.openai()
    return api.chat.completions.create(model=model, **create)


def sse_events(response: httpx.Response) -> list[dict]:
    """The data events of a whole SSE body, which ends with `[DONE]`."""
    lines = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def metric(via, name: str) -> float:
    """One sample of the server's /metrics: unlabelled, or under a vLLM name, whose only
    label is the model served."""
    text = httpx.get(f"{url_of(via)}/metrics", timeout=TIMEOUT).text
    match = re.search(rf'^{re.escape(name)}(?:\{{model_name="[^"]*"\}})? (\S+)$', text, re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def refusal(server, path: str, body: dict) -> dict:
    """The error of `body` POSTed to /v1/`path` with tenant A's key: a 400 that reached
    nothing of the engine."""
    before = metric(server, "loraplex_prompt_tokens_total")
    response = http(server, "POST", f"/v1/{path}", key=server.key_a, json=body)
    assert response.status_code == 400, response.text
    assert metric(server, "loraplex_prompt_tokens_total") == before
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    return error
