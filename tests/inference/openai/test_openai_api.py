"""The OpenAI-compatible API over HTTP, with the official `openai` client, against
`manage.py serve`."""

import json
from functools import partial

import httpx
import openai
import pytest

from tests.clients import chat_stream, metric, openai_chat
from tests.inference.conftest import BASE_NAME, start_server, stop_server
from tests.waiting import wait_for

# The server reads rows committed by the module's fixtures; tests change them only over HTTP.
pytestmark = pytest.mark.django_db
QUESTION = [{"role": "user", "content": "Say something."}]


greedy_chat = partial(openai_chat, messages=QUESTION, max_tokens=12, temperature=0)


def test_chat_completion_on_the_base_model(live_engine_server):
    reply = greedy_chat(live_engine_server, BASE_NAME)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens >= 1 and reply.usage.prompt_tokens > 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.model == BASE_NAME and reply.id.startswith("chatcmpl-")


def test_streaming_equals_the_whole_answer_and_reports_usage(live_engine_server):
    whole = greedy_chat(live_engine_server, "pirate")
    chunks = list(
        live_engine_server.openai().chat.completions.create(
            model="pirate",
            messages=QUESTION,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ] == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_the_adapter_answers_what_the_engine_gives_for_it_directly(live_engine_server):
    from inference.engine import EngineConfig, EngineRequest, LLMEngine, LoRARequest, SamplingParams

    engine = LLMEngine(
        EngineConfig(
            model=live_engine_server.base_dir, kv_cache_bytes=8 * 1024 * 1024, enable_lora=True
        )
    )
    prompt = engine.tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
    params = SamplingParams(temperature=0, max_tokens=12)
    lora = LoRARequest(name="pirate", adapter_id="direct", path=str(live_engine_server.adapter_dir))
    engine.add_request(
        EngineRequest(
            "direct-lora", prompt_token_ids=ids, sampling_params=params, lora_request=lora
        )
    )
    engine.add_request(EngineRequest("direct-base", prompt_token_ids=ids, sampling_params=params))
    texts = {}
    while engine.has_unfinished():
        for out in engine.step():
            texts[out.request_id] = texts.get(out.request_id, "") + out.new_text
    assert (
        greedy_chat(live_engine_server, "pirate").choices[0].message.content == texts["direct-lora"]
    )
    assert (
        greedy_chat(live_engine_server, BASE_NAME).choices[0].message.content
        == texts["direct-base"]
    )
    assert texts["direct-lora"] != texts["direct-base"]  # the adapter visibly changes the answer


def test_completions_endpoint(live_engine_server):
    client = live_engine_server.openai()
    reply = client.completions.create(
        model="pirate@production", prompt="Once upon", max_tokens=5, temperature=0
    )
    assert reply.choices[0].text and reply.usage.completion_tokens >= 1
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="pirate@production", prompt="Once upon", max_tokens=5, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == reply.choices[0].text


def test_logprobs_are_returned_for_every_generated_token(live_engine_server):
    reply = greedy_chat(
        live_engine_server,
        BASE_NAME,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    entries = reply.choices[0].logprobs.content
    assert reply.choices[0].finish_reason == "length"  # ignore_eos: all 12 tokens, no early stop
    assert len(entries) == reply.usage.completion_tokens == 12
    assert all(len(e.top_logprobs) == 3 and e.logprob <= 0 for e in entries)
    # greedy: the chosen token is the most likely one, and its text is part of the answer
    assert all(e.logprob == max(t.logprob for t in e.top_logprobs) for e in entries)
    assert "".join(e.token for e in entries) == reply.choices[0].message.content


def test_models_lists_only_the_callers_tenant(live_engine_server):
    mine = {m.id: m for m in live_engine_server.openai().models.list()}
    assert {BASE_NAME, "pirate", "pirate@production"} <= set(mine)
    assert mine["pirate"].model_extra["parent"] == BASE_NAME
    theirs = {m.id for m in live_engine_server.openai(live_engine_server.key_b).models.list()}
    assert theirs == {BASE_NAME}


def test_another_tenants_adapter_is_404_like_a_missing_one(live_engine_server):
    client = live_engine_server.openai(live_engine_server.key_b)
    errors = []
    for name in ("pirate", "no-such-adapter"):
        with pytest.raises(openai.NotFoundError) as caught:
            client.chat.completions.create(model=name, messages=QUESTION, max_tokens=2)
        errors.append(caught.value.body)
    assert errors[0]["code"] == errors[1]["code"] == "model_not_found"
    assert errors[0]["message"].replace("pirate", "X") == errors[1]["message"].replace(
        "no-such-adapter", "X"
    )


def test_credentials_are_checked(live_engine_server, serve_data):
    with pytest.raises(openai.PermissionDeniedError) as caught:
        greedy_chat_with(live_engine_server, live_engine_server.key_a_no_inference)
    assert caught.value.body["code"] == "insufficient_scope"
    key_id, full = serve_data["key_short"]
    greedy_chat_with(live_engine_server, full)
    revoked = httpx.delete(
        f"{live_engine_server.url}/api/v1/keys/{key_id}/",
        headers={"Authorization": f"Bearer {live_engine_server.key_a}"},
    )
    assert revoked.status_code == 200, revoked.text
    with pytest.raises(openai.AuthenticationError) as caught:
        greedy_chat_with(live_engine_server, full)
    assert caught.value.body["code"] == "revoked_api_key"
    response = httpx.post(f"{live_engine_server.url}/v1/chat/completions", json={})
    assert response.status_code == 401 and response.json()["error"]["code"] == "missing_api_key"


def greedy_chat_with(server, key):
    return openai_chat(server.openai(key), BASE_NAME, messages=QUESTION, max_tokens=2)


def post_raw(server, body: bytes | dict, headers=None):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        f"{server.url}/v1/chat/completions",
        content=data,
        timeout=60,
        headers={
            "Authorization": f"Bearer {server.key_a}",
            "Content-Type": "application/json",
            **(headers or {}),
        },
    )


@pytest.mark.parametrize(
    "body, status, param",
    [
        (b"{not json", 400, None),
        ({"model": BASE_NAME}, 400, "messages"),
        (
            {"model": BASE_NAME, "messages": [{"role": "wizard", "content": "hi"}]},
            400,
            "messages[0].role",
        ),
        (  # found by the API fuzzer (tests/fuzz): a role that is not a string was a 500
            {"model": BASE_NAME, "messages": [{"role": {}, "content": "hi"}]},
            400,
            "messages[0].role",
        ),
        (
            {"model": BASE_NAME, "messages": [{"role": "user", "content": ""}]},
            400,
            "messages[0].content",
        ),
        ({"model": BASE_NAME, "messages": QUESTION, "max_tokens": 0}, 400, "max_tokens"),
        ({"model": BASE_NAME, "messages": QUESTION, "max_tokens": 100000}, 400, "max_tokens"),
        (
            {"model": BASE_NAME, "messages": [{"role": "user", "content": "word " * 600}]},
            400,
            "messages",
        ),
        ({"model": BASE_NAME, "messages": QUESTION, "frobnicate": 1}, 400, "frobnicate"),
        ({"model": BASE_NAME, "messages": QUESTION, "n": 17}, 400, "n"),
        ({"model": BASE_NAME, "messages": [{"role": "user", "content": "x" * 100_000}]}, 413, None),
    ],
)
def test_bad_requests_are_refused_and_the_server_keeps_serving(
    live_engine_server, body, status, param
):
    response = post_raw(live_engine_server, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["code"]
    assert error.get("param") == param
    assert greedy_chat(live_engine_server, BASE_NAME).choices[0].message.content


def test_disconnect_mid_stream_frees_the_engine_request(live_engine_server):
    server = live_engine_server
    with chat_stream(server, server.key_a, model=BASE_NAME, messages=QUESTION) as response:
        lines = response.iter_lines()
        for _ in range(4):
            next(lines)
        assert metric(server, "loraplex_kv_cache_blocks_used") > 0
    wait_for(
        lambda: metric(server, "loraplex_kv_cache_blocks_used") == 0,
        what="the aborted request's KV blocks freed",
    )
    assert metric(server, "loraplex_requests_running") == 0


def test_metrics_scraped_during_a_stream_show_it_running(live_engine_server):
    server = live_engine_server
    before = metric(server, "loraplex_generation_tokens_total")
    with chat_stream(server, server.key_a, model="pirate", messages=QUESTION) as response:
        lines = response.iter_lines()
        while '"content":""' in (line := next(lines)) or not line:
            pass  # the role chunk first: then tokens, so the request is in the batch
        wait_for(
            lambda: metric(server, "loraplex_requests_running") >= 1,
            what="the streaming request counted as running",
        )
        assert metric(server, "loraplex_lora_slots_used") >= 1  # pirate's slot
        assert metric(server, "loraplex_generation_tokens_total") > before
        assert metric(server, "vllm:kv_cache_usage_perc") > 0
    wait_for(  # closing the stream aborts it: the gauge falls back
        lambda: metric(server, "loraplex_requests_running") == 0,
        what="the closed stream no longer counted as running",
    )


def test_metrics_expose_engine_and_router_gauges(live_engine_server):
    greedy_chat(live_engine_server, "pirate")
    text = httpx.get(f"{live_engine_server.url}/metrics", timeout=60).text
    for name in (
        "loraplex_time_to_first_token_seconds_bucket",
        "loraplex_generation_tokens_total",
        "loraplex_lora_lookups_total",
        "loraplex_lora_hits_total",
        "loraplex_lora_slots_used",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:lora_requests_info",
    ):
        assert name in text, name
    assert live_engine_server.key_a.split("_")[1] not in text  # no key ids as labels


def test_over_the_request_limit_is_429_with_retry_after(serve_data):
    key = serve_data["key_limited"]  # used nowhere else: its per-minute count starts at zero
    url, proc, _ = start_server(serve_data["tmp"], {"LORAPLEX_RATE_LIMIT_RPM": "2"})
    try:
        from openai import OpenAI

        client = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        for _ in range(2):
            client.chat.completions.create(model=BASE_NAME, messages=QUESTION, max_tokens=1)
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model=BASE_NAME, messages=QUESTION, max_tokens=1)
        assert int(caught.value.response.headers["Retry-After"]) >= 1
        assert caught.value.body["code"] == "rate_limit_exceeded"
    finally:
        stop_server(proc)
