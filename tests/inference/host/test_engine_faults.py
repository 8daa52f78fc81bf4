"""The engine's step thread raising: the engine is dead, and the process makes way for a new one.

What a failed step leaves (KV blocks half written, an adapter half swapped in, a poisoned
CUDA context) cannot be trusted, so, as in vLLM: every request the engine holds ends with
a clear error, new ones are refused, /readyz is 503, and `serve` exits non-zero for its
supervisor to restart it. Before, the step thread failed only the running batch with a
RuntimeError (a 500 in-stream) and went on stepping, ready as ever.
"""

import asyncio
import json
import threading

import pytest

from inference.engine import (
    AsyncLLMEngine,
    EngineDeadError,
    EngineRequest,
    EngineStoppedError,
    LLMEngine,
    SamplingParams,
)
from inference.management.commands.serve import ENGINE_FAILED_EXIT_CODE
from tests.clients import chat_stream
from tests.inference.conftest import BASE_NAME
from tests.inference.host.fault_serve import start_fault_server
from tests.tiny_llama import make_tiny_llama

LONG = SamplingParams(max_tokens=400, ignore_eos=True)


def _fail_once_asked(engine: AsyncLLMEngine) -> threading.Event:
    fail = threading.Event()
    run = engine.engine.model_runner.run

    def run_or_fail(batch):
        if fail.is_set():
            raise RuntimeError("injected fault in the model runner")
        return run(batch)

    engine.engine.model_runner.run = run_or_fail  # type: ignore[method-assign]
    return fail


def test_a_failed_step_fails_every_request_and_the_engine_stays_dead(tmp_path):
    failures = []
    engine = AsyncLLMEngine(
        LLMEngine(model=make_tiny_llama(tmp_path), kv_cache_bytes=1 << 20, max_num_seqs=2),
        on_failure=failures.append,
    )
    fail = _fail_once_asked(engine)

    async def main():
        # two running, one waiting for a batch slot (max_num_seqs=2), all must end
        streams = [engine.generate(EngineRequest(f"r{i}", "Paris", LONG)) for i in range(3)]
        for stream in streams[:2]:
            await stream.__anext__()
        fail.set()
        ends = []
        for stream in streams:
            with pytest.raises(EngineDeadError) as caught:
                async with asyncio.timeout(30):
                    async for _ in stream:
                        pass
            ends.append(str(caught.value))
        with pytest.raises(EngineStoppedError, match="restarted"):
            engine.generate(EngineRequest("late", "Paris", LONG))
        return ends

    try:
        ends = asyncio.run(main())
    finally:
        engine.shutdown()
    assert all("the engine failed (RuntimeError)" in end for end in ends)
    assert not engine.is_alive()
    assert [type(f) for f in failures] == [RuntimeError]  # told once, with the cause
    assert isinstance(engine.failure, RuntimeError)


def test_readiness_fails_once_the_engine_is_dead(tmp_path, client, db, monkeypatch):
    from inference.host import engine_host
    from platform_site.health import READINESS_CHECKS

    host = engine_host.EngineHost()
    monkeypatch.setattr(engine_host, "HOST", host)
    monkeypatch.setitem(READINESS_CHECKS, "engine", engine_host.check_engine)
    monkeypatch.setitem(READINESS_CHECKS, "broker", lambda: None)  # not what this test is about
    host.engine = AsyncLLMEngine(
        LLMEngine(model=make_tiny_llama(tmp_path), kv_cache_bytes=1 << 20),
        on_failure=host._engine_failed,
    )
    fail = _fail_once_asked(host.engine)
    try:
        assert client.get("/readyz").status_code == 200
        fail.set()

        async def run_one():
            with pytest.raises(EngineDeadError):
                async for _ in host.engine.generate(EngineRequest("r", "Paris", LONG)):
                    pass

        asyncio.run(run_one())
        response = client.get("/readyz")
        assert response.status_code == 503
        assert "engine" in response.json()["failed"]
        assert host.failed
    finally:
        host.shutdown()


def _stream(server, key, out: list, ready: threading.Event):
    """Read one streamed chat completion's data events into `out`."""
    count = [{"role": "user", "content": "Count to a thousand."}]
    with chat_stream(server, key, model=BASE_NAME, messages=count) as response:
        out.append(response.status_code)
        for line in response.iter_lines():
            if line.startswith("data: "):
                out.append(line.removeprefix("data: "))
                if len(out) == 4:
                    ready.set()
    ready.set()


@pytest.mark.django_db  # the test database, which the server's rows live in
def test_serve_fails_the_streams_and_exits_for_its_supervisor(serve_data, tmp_path):
    key = serve_data["keys"][0]
    trigger = tmp_path / "fail-now"
    url, proc, log = start_fault_server(tmp_path, {"LORAPLEX_TEST_STEP_FAULT_FILE": str(trigger)})
    try:
        results = [[], []]
        ready = [threading.Event(), threading.Event()]
        readers = [
            threading.Thread(target=_stream, args=(url, key, results[i], ready[i]))
            for i in range(2)
        ]
        for reader in readers:
            reader.start()
        for event in ready:
            assert event.wait(60), log.read_text()
        trigger.touch()
        for reader in readers:
            reader.join(30)
            assert not reader.is_alive(), "a stream hangs after the engine failed"
        for events in results:
            assert events[0] == 200
            assert events[-1] == "[DONE]"
            error = json.loads(events[-2])["error"]
            assert error["code"] == "engine_unavailable", error
            assert "the engine failed (RuntimeError)" in error["message"]
        assert proc.wait(timeout=30) == ENGINE_FAILED_EXIT_CODE
        output = log.read_text()
        assert "injected fault in the model runner" in output  # the traceback is logged
        assert "exiting so that the supervisor starts a fresh process" in output
    finally:
        if proc.poll() is None:
            proc.kill()
