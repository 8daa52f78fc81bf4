"""AsyncLLMEngine: one step thread, many asyncio callers."""

import asyncio
import threading

import pytest

from inference.engine import (
    AsyncLLMEngine,
    DuplicateRequestError,
    EngineRequest,
    EngineStoppedError,
    LLMEngine,
    SamplingParams,
    SamplingParamsError,
)
from tests.tiny_llama import make_tiny_llama

PROMPTS = ["The quick brown fox", "Paris", "Many tenants share one base model", "Numbers 0 1 2 3"]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def expected(model_dir):
    engine = LLMEngine(model=model_dir, kv_cache_bytes=1 << 20)
    return [engine.generate([p], GREEDY)[0] for p in PROMPTS]


@pytest.fixture
def engine(model_dir):
    engine = AsyncLLMEngine.from_config(model=model_dir, kv_cache_bytes=1 << 20)
    yield engine
    engine.shutdown()


async def collect(engine, request_id, prompt, params=GREEDY):
    outs = [out async for out in engine.generate(EngineRequest(request_id, prompt, params))]
    return outs


def test_concurrent_callers_each_get_their_own_output(engine, expected):
    async def main():
        return await asyncio.gather(
            *(collect(engine, f"r{i}", p) for i, p in enumerate(PROMPTS * 2))
        )

    results = asyncio.run(main())
    for i, outs in enumerate(results):
        want = expected[i % len(PROMPTS)]
        assert all(o.request_id == f"r{i}" for o in outs)
        assert [t for o in outs for t in o.new_token_ids] == want.token_ids
        assert "".join(o.new_text for o in outs) == want.text
        last = outs[-1]
        assert last.finished and last.finish_reason == "length"
        assert (last.prompt_tokens, last.completion_tokens) == (len(want.prompt_token_ids), 10)
        assert not any(o.finished for o in outs[:-1])


def test_callers_on_different_event_loops(engine, expected):
    results = {}

    def caller(i):
        results[i] = asyncio.run(collect(engine, f"t{i}", PROMPTS[i]))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i, want in enumerate(expected):
        assert [t for o in results[i] for t in o.new_token_ids] == want.token_ids


def test_cancelling_a_caller_aborts_its_request_and_frees_its_blocks(engine, expected):
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)

    async def main():
        started = asyncio.Event()

        async def doomed():
            async for _ in engine.generate(EngineRequest("doomed", PROMPTS[2], long)):
                started.set()

        task = asyncio.create_task(doomed())
        await started.wait()
        survivor = asyncio.create_task(collect(engine, "survivor", PROMPTS[0]))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await survivor

    outs = asyncio.run(main())
    assert [t for o in outs for t in o.new_token_ids] == expected[0].token_ids
    stats = _settled(engine)
    assert stats["finished"]["abort"] == 1
    assert stats["kv_blocks_used"] == 0 and stats["requests_running"] == 0


def test_breaking_out_of_the_loop_aborts_the_request(engine):
    async def main():
        async for _ in engine.generate(
            EngineRequest("quitter", PROMPTS[0], SamplingParams(max_tokens=400, ignore_eos=True))
        ):
            break

    asyncio.run(main())
    stats = _settled(engine)
    assert stats["finished"]["abort"] == 1 and stats["kv_blocks_used"] == 0


def test_bad_requests_raise_at_once_and_the_engine_keeps_serving(engine, expected):
    async def main():
        with pytest.raises(SamplingParamsError):
            engine.generate(EngineRequest("bad", PROMPTS[0], SamplingParams(temperature=-1)))
        stream = engine.generate(EngineRequest("dup", PROMPTS[0], GREEDY))
        with pytest.raises(DuplicateRequestError):
            engine.generate(EngineRequest("dup", PROMPTS[1], GREEDY))
        return [o async for o in stream]

    outs = asyncio.run(main())
    assert [t for o in outs for t in o.new_token_ids] == expected[0].token_ids


def test_server_side_abort_ends_the_stream_with_abort(engine):
    async def main():
        outs = []
        async for out in engine.generate(
            EngineRequest("victim", PROMPTS[0], SamplingParams(max_tokens=400, ignore_eos=True))
        ):
            outs.append(out)
            if len(outs) == 2:
                engine.abort("victim")
        return outs

    outs = asyncio.run(main())
    assert outs[-1].finished and outs[-1].finish_reason == "abort"


def test_shutdown_ends_open_streams_and_refuses_new_requests(model_dir):
    engine = AsyncLLMEngine.from_config(model=model_dir, kv_cache_bytes=1 << 20)

    async def main():
        stream = engine.generate(
            EngineRequest("open", PROMPTS[0], SamplingParams(max_tokens=10_000, ignore_eos=True))
        )
        first = await stream.__anext__()
        await asyncio.to_thread(engine.shutdown)
        rest = [o async for o in stream]
        with pytest.raises(EngineStoppedError):
            engine.generate(EngineRequest("late", PROMPTS[0], GREEDY))
        return [first, *rest]

    outs = asyncio.run(main())
    assert outs[-1].finish_reason == "abort"


def _settled(engine: AsyncLLMEngine) -> dict:
    """Stats once the step thread has applied pending aborts."""
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stats = engine.stats()
        if (
            stats["requests_running"] == stats["requests_waiting"] == 0
            and not engine.engine.has_unfinished()
        ):
            return stats
        time.sleep(0.01)
    return engine.stats()
