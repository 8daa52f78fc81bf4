"""`n` choices: one HTTP request fanned out into `n` engine requests (choice i samples with
`seed + i`, as in vLLM), merged into one answer or one stream, metered once.

The live tests run the real `openai` client against `manage.py serve` with the tiny model;
the first ones check the merging of engine streams (inference/openai/choices.py) on the engine's
own RequestStream objects.
"""

import asyncio
from functools import partial

import httpx
import openai
import pytest

from inference.engine import RequestOutput, RequestStream
from inference.engine.errors import AdapterLoadError
from inference.openai.choices import ChoiceStreams
from tests.clients import metric, openai_chat
from tests.inference.conftest import BASE_NAME, start_server, stop_server
from tests.processes import committed
from tests.waiting import wait_for

# The server reads rows committed by the module's fixtures; tests change them only over HTTP.
pytestmark = pytest.mark.django_db
QUESTION = [{"role": "user", "content": "Tell me a story."}]
PROMPT = list(range(10, 18))  # token ids: exactly 8 prompt tokens
SEED = 1234


# ---------------------------------------------------------------- merging engine streams


def output(request_id: str, text: str, finished: bool = False) -> RequestOutput:
    return RequestOutput(
        request_id=request_id,
        new_token_ids=[5],
        new_text=text,
        new_logprobs=[],
        finished=finished,
        finish_reason="length" if finished else None,
        prompt_tokens=3,
        completion_tokens=1,
    )


def streams(n: int, closed: list[str]) -> list[RequestStream]:
    loop = asyncio.get_running_loop()
    return [RequestStream(f"r-{i}", loop, closed.append) for i in range(n)]


def test_choices_interleave_in_arrival_order_and_end_when_all_finish() -> None:
    async def run():
        closed = []
        engine_streams = streams(3, closed)
        merged = ChoiceStreams(engine_streams)
        engine_streams[2].put(output("r-2", "c"))
        engine_streams[0].put(output("r-0", "a", finished=True))
        engine_streams[1].put(output("r-1", "b"))
        seen = [(i, out.new_text) for i, out in [await merged.__anext__() for _ in range(3)]]
        engine_streams[1].put(output("r-1", "B", finished=True))
        engine_streams[2].put(output("r-2", "C", finished=True))
        seen += [(i, out.new_text) async for i, out in merged]
        return seen, closed

    seen, closed = asyncio.run(run())
    assert sorted(seen[:3]) == [(0, "a"), (1, "b"), (2, "c")]
    assert sorted(seen[3:]) == [(1, "B"), (2, "C")]
    assert closed == []  # every choice finished: nothing to abort


def test_one_failing_choice_raises_and_aborts_the_others() -> None:
    async def run():
        closed = []
        engine_streams = streams(3, closed)
        merged = ChoiceStreams(engine_streams)
        engine_streams[0].put(output("r-0", "a", finished=True))
        engine_streams[1].put(AdapterLoadError("the adapter failed its checks"))
        with pytest.raises(AdapterLoadError):
            async for _ in merged:
                pass
        await asyncio.sleep(0)  # the forwarding tasks see their cancellation
        return closed

    assert sorted(asyncio.run(run())) == ["r-2"]  # r-0 finished and r-1 failed: no abort


def test_closing_or_cancelling_the_reader_aborts_every_unfinished_choice() -> None:
    async def run():
        closed = []
        engine_streams = streams(3, closed)
        merged = ChoiceStreams(engine_streams)
        reader = asyncio.ensure_future(merged.__anext__())
        await asyncio.sleep(0.01)
        reader.cancel()  # a client gone while its request waited for tokens
        with pytest.raises(asyncio.CancelledError):
            await reader
        cancelled = sorted(closed)
        closed.clear()
        other = ChoiceStreams(streams(2, closed))
        other.close()  # from synchronous code: the end of the HTTP request
        other.close()
        return cancelled, sorted(closed)

    cancelled, closed = asyncio.run(run())
    assert cancelled == ["r-0", "r-1", "r-2"]
    assert closed == ["r-0", "r-1"]


# ---------------------------------------------------------------- live


chat = partial(
    openai_chat,
    model=BASE_NAME,
    messages=QUESTION,
    temperature=1.0,
    max_tokens=8,
    extra_body={"ignore_eos": True},
)


def test_n_choices_equal_single_requests_seeded_seed_plus_i(live_engine_server):
    reply = chat(live_engine_server, n=3, seed=SEED)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    singles = [chat(live_engine_server, seed=SEED + i) for i in range(3)]
    texts = [c.message.content for c in reply.choices]
    assert texts == [s.choices[0].message.content for s in singles]
    assert len(set(texts)) > 1  # each choice samples with its own seed
    assert all(c.finish_reason == "length" for c in reply.choices)
    # usage: the shared prompt once, every choice's tokens
    assert reply.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert reply.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles) == 24
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 24


def test_completions_take_n_with_seeds_too(live_engine_server):
    client = live_engine_server.openai()
    kwargs = {"model": "pirate", "prompt": PROMPT, "max_tokens": 6, "temperature": 1.0}
    reply = client.completions.create(n=2, seed=SEED, **kwargs)
    singles = [client.completions.create(seed=SEED + i, **kwargs) for i in range(2)]
    assert [(c.index, c.text) for c in reply.choices] == [
        (i, single.choices[0].text) for i, single in enumerate(singles)
    ]
    assert reply.usage.prompt_tokens == len(PROMPT)
    assert reply.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)


def test_a_stream_of_n_choices_interleaves_them_with_their_index(live_engine_server):
    whole = chat(live_engine_server, n=3, seed=SEED)
    chunks = list(
        chat(
            live_engine_server,
            n=3,
            seed=SEED,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    roles = [c.choices[0].index for c in chunks[:3]]
    assert roles == [0, 1, 2] and all(c.choices[0].delta.role == "assistant" for c in chunks[:3])
    texts, finishes = {0: "", 1: "", 2: ""}, {}
    order = [c.choices[0].index for c in chunks[3:-1] if c.choices[0].delta.content]
    assert order != sorted(order)  # interleaved as the tokens come, not choice after choice
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices  # one choice per chunk, as OpenAI streams them
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finishes[choice.index] = choice.finish_reason
    assert [texts[i] for i in range(3)] == [c.message.content for c in whole.choices]
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()


@pytest.mark.parametrize("n", [0, -1, 17, "3", True, 2.5])
def test_a_bad_n_is_a_400_naming_it_and_nothing_reaches_the_engine(live_engine_server, n):
    before = metric(live_engine_server, "loraplex_prompt_tokens_total")
    response = httpx.post(
        f"{live_engine_server.url}/v1/chat/completions",
        json={"model": BASE_NAME, "messages": QUESTION, "max_tokens": 2, "n": n},
        headers={"Authorization": f"Bearer {live_engine_server.key_a}"},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "n" and error["code"] == "invalid_request"
    assert metric(live_engine_server, "loraplex_prompt_tokens_total") == before


def test_a_seed_too_large_for_its_last_choice_is_refused(live_engine_server):
    with pytest.raises(openai.BadRequestError) as caught:
        chat(live_engine_server, n=2, seed=2**63 - 1)
    assert caught.value.body["param"] == "seed" and "seed + i" in caught.value.body["message"]


def test_a_client_gone_mid_stream_aborts_every_choice(live_engine_server):
    stream = chat(live_engine_server, n=3, max_tokens=400, stream=True)
    seen = set()
    for chunk in stream:  # past the role chunks, until tokens of every choice are coming
        if chunk.choices[0].delta.content:
            seen.add(chunk.choices[0].index)
        if len(seen) == 3:
            break
    in_engine = metric(live_engine_server, "loraplex_requests_running") + metric(
        live_engine_server, "loraplex_requests_waiting"
    )
    assert in_engine == 3
    stream.close()  # the client goes away

    def all_aborted() -> bool:
        return (
            metric(live_engine_server, "loraplex_requests_running") == 0
            and metric(live_engine_server, "loraplex_kv_cache_blocks_used") == 0
        )

    wait_for(all_aborted, what="every choice aborted, its KV blocks freed")


def test_one_usage_record_per_http_request(live_engine_server):
    from tenants.models import UsageRecord

    records = UsageRecord.objects.filter(tenant__slug="serve-b")  # used by no other test here
    client = live_engine_server.openai(live_engine_server.key_b)
    reply = client.completions.create(
        model=BASE_NAME,
        prompt=PROMPT,
        max_tokens=5,
        n=4,
        seed=SEED,
        extra_body={"ignore_eos": True},
    )
    assert reply.usage.prompt_tokens == len(PROMPT) and reply.usage.completion_tokens == 20
    # Records are queued as each request ends, before its answer, and written in that order:
    # once the record of a request sent after this one is stored, all of this one's are.
    later = client.completions.create(model=BASE_NAME, prompt=PROMPT[:3], max_tokens=1)
    assert later.usage.prompt_tokens == 3
    wait_for(
        lambda: committed(records.filter(prompt_tokens=3).exists),
        what="the later request's usage record",
    )
    (record,) = committed(lambda: list(records.exclude(prompt_tokens=3)))
    assert (record.prompt_tokens, record.completion_tokens, record.status) == (
        len(PROMPT),
        20,
        UsageRecord.OK,
    )


@pytest.fixture(scope="module")
def tpm_server(serve_data, django_db_blocker):
    """A server whose tenants may use 100 tokens a minute, and a key of a tenant of its own
    (committed before the test, whose own writes the server would not see)."""
    from tenants.models import Tenant
    from tenants.services import api_key_create, tenant_create

    with django_db_blocker.unblock():
        tenant = tenant_create(slug="n-choices-tpm", name="n choices")
        _, key = api_key_create(tenant=tenant, name="tpm", scopes=["inference"])
    url, proc, _ = start_server(serve_data["tmp"], {"LORAPLEX_RATE_LIMIT_TPM": "100"})
    yield url, key
    stop_server(proc)
    with django_db_blocker.unblock():
        Tenant.objects.filter(slug="n-choices-tpm").delete()


def test_the_token_reservation_is_n_times_the_prompt_and_max_tokens(tpm_server):
    """Every choice is an engine request that reads its prompt: each is charged it."""
    url, key = tpm_server
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:  # 4 * (8 + 24) = 128 > 100
        client.completions.create(model=BASE_NAME, prompt=PROMPT, max_tokens=24, n=4)
    assert caught.value.body["code"] == "tokens_exceeded"
    assert "may use 128 tokens" in caught.value.body["message"]
    reply = client.completions.create(model=BASE_NAME, prompt=PROMPT, max_tokens=24, n=3)
    assert len(reply.choices) == 3  # 3 * (8 + 24) = 96 fits


def test_a_batch_reserves_every_prompt_and_its_choices(tpm_server):
    url, key = tpm_server
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:  # 2 x 2 x (8 + 24) = 128 > 100
        client.completions.create(model=BASE_NAME, prompt=[PROMPT, PROMPT], max_tokens=24, n=2)
    assert "may use 128 tokens" in caught.value.body["message"]


def test_the_choices_share_their_prompt_through_the_prefix_cache(live_engine_server):
    """The counters /metrics exports (tests/inference/test_prefix_cache_metrics.py), live."""
    prompt = list(range(40, 120))  # 80 tokens: five KV blocks of 16
    names = ("loraplex_prefix_cache_queries_total", "loraplex_prefix_cache_hits_total")

    def counted(**kwargs) -> tuple[float, float]:
        before = [metric(live_engine_server, name) for name in names]
        live_engine_server.openai().completions.create(
            model=BASE_NAME, prompt=prompt, max_tokens=2, seed=SEED, **kwargs
        )
        queries, hits = (
            metric(live_engine_server, name) - b for name, b in zip(names, before, strict=True)
        )
        return queries, hits

    queries, hits = counted(n=3)
    assert queries == 3 * len(prompt)  # in tokens: every choice looks its whole prompt up
    # the first choice computes the prompt; the other two share its blocks in the same step,
    # all but the one holding the last token (always computed, for the next token's logits)
    assert hits == 2 * 64
    queries, hits = counted()
    # the blocks serve the same prompt again
    assert (queries, hits) == (len(prompt), 64)
    for name in names:
        vllm_name = name.replace("loraplex_", "vllm:")
        assert metric(live_engine_server, vllm_name) == metric(live_engine_server, name)
