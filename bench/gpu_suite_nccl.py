"""How fast a tensor-parallel engine fails on a lost rank, on NCCL: two ranks on two GPUs,
rank 1 killed mid-request, then, on a fresh engine, rank 1 stopped (alive, silent); the
seconds from each until the engine raises RankFailedError. Under NCCL rank 0 waits in a host
sync that no collective error ends by itself, so these are the figures that show the
watchdog and the communicator's abort at work. One GPU cannot hold two ranks: the section
says so instead of failing. On --interpret's CPU the same runs on gloo."""

import os
import signal
import time
from typing import Any

from gpu_suite_context import Context
from gpu_suite_models import build_random_llama, llama_shape

Figures = dict[str, Any]
SHAPE = (64, 2, 4, 2, 128, 512, 256)  # hidden, layers, heads, kv heads, ffn, vocab, positions
STOP_DEADLINE_S = 3  # LORAPLEX_TP_TIMEOUT_SECONDS for the stopped rank: the wait it measures
# the stopped rank's run repeats the killed one's start and adds its deadline: it fits the
# section's 20 s cap only when the killed one's run took less than this
STOP_BUDGET_S = 7.0
FAILURE_BOUND_S = 60.0  # a step loop still running after this is reported, not waited on


def nccl(ctx: Context) -> Figures:
    import torch

    gpus = torch.cuda.device_count() if ctx.device.type == "cuda" else 0
    figures: Figures = {"backend": "nccl" if ctx.device.type == "cuda" else "gloo", "gpus": gpus}
    if ctx.device.type == "cuda" and gpus < 2:
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(gpus)) or "none"
        figures["skipped"] = (
            f"needs 2 GPUs for 2 NCCL ranks; this machine has {gpus} ({names}): the NCCL "
            "path is covered by the unit test of its settings and the gloo tests only"
        )
        return figures
    folder = ctx.workdir / "nccl-model"
    build_random_llama(folder, llama_shape(*SHAPE), device=torch.device("cpu"), dtype=ctx.dtype,
                       init_std=ctx.profile.init_std)  # fmt: skip
    started = time.monotonic()
    figures["killed_rank"] = time_to_failure(ctx, folder, signal.SIGKILL)
    if time.monotonic() - started < STOP_BUDGET_S:
        figures["stopped_rank"] = time_to_failure(ctx, folder, signal.SIGSTOP, STOP_DEADLINE_S)
    else:
        figures["stopped_rank"] = {
            "skipped": f"the killed rank's run took {STOP_BUDGET_S:g} s or more: no time left"
        }
    return figures


def time_to_failure(
    ctx: Context, folder: Any, sig: signal.Signals, deadline: float = 120
) -> Figures:
    """Start a two-rank engine, decode until a token came back, send rank 1 `sig`, then step
    until the engine raises: the seconds that took, and the error."""
    from inference.engine import EngineRequest, SamplingParams
    from inference.engine.parallel_workers import RankFailedError

    os.environ["LORAPLEX_TP_TIMEOUT_SECONDS"] = str(deadline)  # the workers inherit it
    engine = ctx.engine(folder, tensor_parallel_size=2, attention_backend="torch",
                        max_model_len=SHAPE[-1], max_num_seqs=4,
                        kv_cache_bytes=1 << 24)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=SHAPE[-1] // 2, ignore_eos=True)
    requests = 0

    def step() -> list[Any]:
        """One step, with a request to run (a new one once the last finished); raises
        RankFailedError once the engine knows of a lost rank."""
        nonlocal requests
        if not engine.has_unfinished():
            requests += 1
            request = EngineRequest(f"r{requests}", prompt_token_ids=[5, 6, 7],
                                    sampling_params=params)  # fmt: skip
            engine.add_request(request)
        return engine.step()

    try:
        while not any(o.new_token_ids for o in step()):
            pass
        workers = engine.model_runner.workers
        os.kill(workers.processes[0].pid, sig)
        sent = time.monotonic()
        while time.monotonic() - sent < FAILURE_BOUND_S:
            try:
                step()
            except RankFailedError as e:
                return {"signal": sig.name, "deadline_s": deadline,
                        "seconds_to_failure": round(time.monotonic() - sent, 3),
                        "error": str(e)}  # fmt: skip
        return {"signal": sig.name, "error": f"no RankFailedError within {FAILURE_BOUND_S:g} s"}
    finally:
        engine.close()
