"""vLLM's `stream_options.continuous_usage_stats` (GuideLLM sends it on every streamed request):
each token chunk carries the usage so far, over HTTP against `manage.py serve`; a value that
is not a boolean is a 400 naming it."""

import pytest

from inference.errors import ProtocolError
from inference.openai.protocol import parse_chat_request
from tests.clients import http, sse_events
from tests.inference.conftest import BASE_NAME

pytestmark = pytest.mark.django_db
QUESTION = [{"role": "user", "content": "Say something."}]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_every_token_chunk_counts_the_tokens_so_far(live_engine_server, path):
    body = {
        "model": "pirate",
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        **({"messages": QUESTION} if "chat" in path else {"prompt": "The quick brown fox"}),
    }
    answer = http(live_engine_server, "POST", path, key=live_engine_server.key_a, json=body)
    assert answer.status_code == 200, answer.text
    events = sse_events(answer)
    final = events[-1]["usage"]  # include_usage: the last chunk, with no choices
    assert events[-1]["choices"] == [] and final["completion_tokens"] == 6
    counted = [e["usage"] for e in events[:-1] if e["choices"] and "usage" in e]
    assert len(counted) >= 2
    completion = [u["completion_tokens"] for u in counted]
    assert completion == sorted(completion) and completion[-1] == 6
    for usage in counted:
        assert usage["prompt_tokens"] == final["prompt_tokens"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_without_it_token_chunks_carry_no_usage(live_engine_server):
    body = {
        "model": BASE_NAME,
        "messages": QUESTION,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    answer = http(
        live_engine_server, "POST", "/v1/chat/completions", key=live_engine_server.key_a, json=body
    )
    events = sse_events(answer)
    assert all("usage" not in e for e in events[:-1]) and "usage" in events[-1]


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"continuous_usage_stats": "yes"}, "stream_options.continuous_usage_stats"),
        ({"continuous_usage_stats": 1}, "stream_options.continuous_usage_stats"),
        ({"include_usage": True, "other": True}, "stream_options"),
    ],
)
def test_a_bad_stream_option_is_refused_naming_it(options, param):
    body = {"model": "m", "messages": QUESTION, "stream": True, "stream_options": options}
    with pytest.raises(ProtocolError) as caught:
        parse_chat_request(body)
    assert caught.value.param == param and caught.value.status == 400
