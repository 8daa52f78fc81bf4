"""CPU decode batch changes: what a request joining a running decode batch, or leaving it,
costs on the torch attention backend, against gathering every running sequence's keys and
values afresh (`gather_kv`, what the decode path did on every batch change before it kept
a buffer per sequence).

    .venv/bin/python bench/cpu_batch_change.py [--model DIR] [--running 16]
        [--system-tokens 1000] [--steady-steps 4] [--kv-cache-mib 1536] [--reps 3]

--running chat requests share a tenant's system prompt of about --system-tokens tokens
(bench/prefix_cache.py's), each with its own question, greedy, eos ignored; once all of
them decode, --steady-steps decode steps are timed. Then a request with the same system
prompt arrives (its prefix cached): its TTFT is its prefill step beside the running decodes.
A second one arrives as soon as the first has its first token, as a stream of users would,
so its TTFT step is also the step where the first joins the decode batch, and that join's
copies are counted by the attention path itself (the engine's `kv_copies`: tokens copied
from the cache into decode buffers). Then one running request is aborted and the next step
(a leave) is timed and counted.

Side by side, on the engine's own cache and block tables as they stand after that join, for
every layer: the join's copy as the engine makes it (the joining sequence's blocks into its
slot) and the reference copy (`gather_kv` of every decoding sequence into padded buffers of
the length the old path used), each timed (median of --reps) and counted in bytes.
Goal: a join copies its own tokens only. The last line is one JSON object of the figures.
"""

import json
import statistics
import time

import torch
from common import bench_parser, model_dir
from prefix_cache import QUESTIONS, chat_ids, system_prompt

from inference.engine import EngineRequest, LLMEngine, SamplingParams
from inference.engine.model.attention import gather_kv
from inference.engine.model.context import DecodeBufferPlan
from inference.engine.model.decode_kv import DecodeKV

OLD_HEADROOM = 64  # tokens the old padded copies had to spare


class Clocked:
    """An engine stepped one step at a time, each step timed; first tokens stamped."""

    def __init__(self, engine: LLMEngine, max_tokens: int):
        self.engine = engine
        self.params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        self.clock = 0.0
        self.added: dict[str, float] = {}
        self.ttft: dict[str, float] = {}

    def add(self, rid: str, prompt: list[int]) -> None:
        self.added[rid] = self.clock
        self.engine.add_request(EngineRequest(rid, None, self.params, prompt_token_ids=prompt))

    def step(self) -> float:
        start = time.perf_counter()
        outputs = self.engine.step()
        seconds = time.perf_counter() - start
        self.clock += seconds
        for out in outputs:
            if out.new_token_ids and out.request_id not in self.ttft:
                self.ttft[out.request_id] = self.clock - self.added[out.request_id]
        return seconds

    def until_first_token(self, rid: str) -> None:
        while rid not in self.ttft:
            self.step()

    def decoding(self) -> list:
        return [s for s in self.engine.scheduler.running if s.num_uncomputed_tokens == 1]


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copies_side_by_side(engine: LLMEngine, decoding: list, joined, tokens: int, reps: int) -> dict:
    """The join's copy as the engine makes it (the joining sequence's first `tokens`) and
    the reference gather of the step's decode batch, timed on the engine's cache over
    every layer, with their bytes."""
    runner = engine.model_runner
    layers = runner.attention_layers
    block_size = engine.config.block_size
    width = max(len(s.block_table) for s in decoding)
    tables = torch.tensor([s.block_table + [0] * (width - len(s.block_table)) for s in decoding])
    longest = max(len(s) for s in decoding)
    old_len = -(-(longest + OLD_HEADROOM) // block_size) * block_size
    own = torch.tensor([joined.block_table])
    plan = DecodeBufferPlan({0: (1, -(-tokens // block_size) * block_size)}, [(0, 0, 0, tokens)])

    def join_copy() -> None:
        for layer in layers:
            DecodeKV().apply(plan, own, (layer.k_cache, layer.v_cache))

    def gather_all() -> None:
        for layer in layers:
            gather_kv(layer.k_cache, tables, old_len)
            gather_kv(layer.v_cache, tables, old_len)

    token_bytes = runner.input_builder.token_bytes  # keys and values, every layer
    return {
        "join_copy_s": round(timed(join_copy, reps), 4),
        "join_copy_bytes": tokens * token_bytes,
        "gather_all_s": round(timed(gather_all, reps), 4),
        "gather_all_bytes": len(decoding) * old_len * token_bytes,
        "gather_all_sequences": len(decoding),
    }


def main():
    args = bench_parser(
        __doc__, running=16, system_tokens=1000, steady_steps=4, kv_cache_mib=1536, reps=3
    ).parse_args()
    base = model_dir(args.model)
    engine = LLMEngine(
        model=base,
        device="cpu",
        dtype="float32",
        max_model_len=4096,
        kv_cache_bytes=args.kv_cache_mib << 20,
        enable_prefix_caching=True,
    )
    tok = engine.tokenizer
    system = system_prompt(tok, args.system_tokens)
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(args.running + 2)]
    prompts = [chat_ids(tok, system, question) for question in questions]
    max_tokens = 3 * args.steady_steps + 64
    engine.generate(["Hello there, how are you?"], SamplingParams(temperature=0, max_tokens=2))
    side = Clocked(engine, max_tokens)
    for i in range(args.running):
        side.add(f"run{i}", prompts[i])
    while len(side.decoding()) < args.running:
        side.step()
    side.step()  # the last to start decoding join; from here on the batch stays
    steady = statistics.median(side.step() for _ in range(args.steady_steps))
    runner = engine.model_runner
    side.add("join0", prompts[args.running])
    side.until_first_token("join0")
    ttft_first = side.ttft["join0"]
    side.add("join1", prompts[args.running + 1])  # its prefill step is join0's join
    side.until_first_token("join1")
    join_step = side.clock - side.added["join1"]
    join_copied = runner.kv_copies.copied
    [joined] = [s for s in engine.scheduler.running if s.request_id == "join0"]
    join_expected = len(joined) - 2  # its tokens before the one that step fed
    decoded = [s for s in side.decoding() if s.request_id != "join1"]  # that step's decodes
    side_by_side = copies_side_by_side(engine, decoded, joined, join_expected, args.reps)
    side.step()  # join1 joins the decode batch
    engine.abort("run0")
    leave_step = side.step()
    leave_copied = runner.kv_copies.copied
    token_bytes = runner.input_builder.token_bytes
    figures = {
        "model": base.name,
        "running": args.running,
        "prompt_tokens": len(prompts[args.running]),
        "steady_step_s": round(steady, 4),
        "ttft_s": round(ttft_first, 4),
        "ttft_with_a_join_s": round(join_step, 4),
        "join_copied_tokens": join_copied,
        "join_copied_bytes": join_copied * token_bytes,
        "join_own_tokens": join_expected,
        "leave_step_s": round(leave_step, 4),
        "leave_copied_tokens": leave_copied,
        **side_by_side,
        # what the old path's join would have cost this step: everyone gathered instead
        "ttft_with_a_join_gather_all_estimate_s": round(
            join_step - side_by_side["join_copy_s"] + side_by_side["gather_all_s"], 4
        ),
        "gather_over_join_bytes": round(
            side_by_side["gather_all_bytes"] / max(side_by_side["join_copy_bytes"], 1), 1
        ),
        "torch_threads": torch.get_num_threads(),
    }
    print(
        f"{args.running} running, prompts of {figures['prompt_tokens']} tokens: steady step "
        f"{figures['steady_step_s']} s, TTFT {figures['ttft_s']} s, TTFT beside a join "
        f"{figures['ttft_with_a_join_s']} s, join copied {join_copied} tokens "
        f"({join_expected} its own), leave copied {leave_copied}; join copy "
        f"{side_by_side['join_copy_s']} s / {side_by_side['join_copy_bytes']} B against "
        f"gathering everyone {side_by_side['gather_all_s']} s / "
        f"{side_by_side['gather_all_bytes']} B",
        flush=True,
    )
    engine.close()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
