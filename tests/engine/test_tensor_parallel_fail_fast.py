"""A tensor-parallel engine fails fast: an NCCL group is set to abort its communicator rather
than the process, and a rank that stops answering (stopped, not exited: its sockets stay
open) fails the engine's requests with RankFailedError once a step runs past the deadline,
on gloo here as on NCCL."""

import asyncio
import datetime
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from inference.engine import (
    AsyncLLMEngine,
    EngineDeadError,
    EngineRequest,
    LLMEngine,
    SamplingParams,
)
from inference.engine.parallel.fail_fast import NCCL_ENVIRONMENT, group_timeout
from inference.engine.parallel.group import free_address, join_group, leave_group
from inference.engine.parallel_workers import RankFailedError

DEADLINE_SECONDS = 10  # far above a tiny model's step on a loaded CPU; the test waits it out


def test_an_nccl_group_aborts_its_communicator_instead_of_the_process(monkeypatch):
    """Joining on CUDA sets NCCL's error handling before the group starts, over torch's
    defaults (which tear the process down) and an operator's blocking wait (a host sync per
    collective). Without a GPU build the group itself cannot start; the settings are in place
    by then."""
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", "1")
    try:
        join_group(free_address(), 0, 1, torch.device("cuda", 0))
    except RuntimeError as e:  # a CPU build of torch, or no device
        assert not dist.is_initialized(), e
    else:
        assert dist.get_backend() == "nccl"
    finally:
        leave_group()
    assert NCCL_ENVIRONMENT == {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
        "TORCH_NCCL_BLOCKING_WAIT": "0",
    }
    for name, value in NCCL_ENVIRONMENT.items():
        assert os.environ[name] == value


def test_a_gloo_group_leaves_nccl_settings_alone(monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    join_group(free_address(), 0, 1, torch.device("cpu"))
    try:
        assert dist.get_backend() == "gloo"
    finally:
        leave_group()
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"


def test_the_groups_own_timeout_leaves_the_step_deadline_to_act_first():
    assert group_timeout(DEADLINE_SECONDS) > datetime.timedelta(seconds=DEADLINE_SECONDS)


def test_a_rank_that_stops_answering_fails_the_engine_after_the_deadline(
    lora_model_dir, monkeypatch
):
    monkeypatch.setenv("LORAPLEX_TP_TIMEOUT_SECONDS", str(DEADLINE_SECONDS))
    llm = LLMEngine(model=lora_model_dir, kv_cache_bytes=1 << 20, tensor_parallel_size=2)
    failures = []
    engine = AsyncLLMEngine(llm, on_failure=failures.append)
    workers = llm.model_runner.workers
    assert workers is not None
    worker = workers.processes[0]
    long = SamplingParams(max_tokens=400, ignore_eos=True)

    async def main() -> float:
        stream = engine.generate(EngineRequest("long", "Paris", long))
        await stream.__anext__()
        os.kill(worker.pid, signal.SIGSTOP)  # alive, its sockets open: gloo would wait
        stopped = time.monotonic()
        with pytest.raises(EngineDeadError, match="RankFailedError"):
            async with asyncio.timeout(10 * DEADLINE_SECONDS):  # only a bound on a bug
                async for _ in stream:
                    pass
        return time.monotonic() - stopped

    try:
        waited = asyncio.run(main())
        assert not engine.is_alive()
    finally:
        engine.shutdown()
    assert [type(f) for f in failures] == [RankFailedError]
    assert f"did not finish within {DEADLINE_SECONDS} s" in str(failures[0])
    assert worker.exitcode == -signal.SIGKILL  # the stopped rank is not left behind
    print(f"a stopped rank failed the engine {waited:.1f} s after it stopped")
