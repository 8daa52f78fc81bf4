"""Engine metrics: what the serving layer will export."""

from inference.engine import EngineRequest, LLMEngine, SamplingParams
from inference.engine.metrics import Histogram
from tests.tiny_llama import make_tiny_llama


def test_histogram_counts_into_cumulative_buckets():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v)
    snap = h.snapshot()
    assert snap["buckets"] == [(0.1, 2), (1.0, 3), (float("inf"), 4)]
    assert snap["count"] == 4 and snap["sum"] == 3.65


def test_engine_counts_tokens_latencies_and_finishes(tmp_path):
    engine = LLMEngine(model=make_tiny_llama(tmp_path), max_num_seqs=2, kv_cache_bytes=1 << 20)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    for i, prompt in enumerate(["one", "two words", "three words here"]):
        engine.add_request(EngineRequest(str(i), prompt, params))
    prompt_tokens = sum(len(s) for s in engine.requests.values())
    engine.step()
    during = engine.stats()
    assert (during["requests_running"], during["requests_waiting"]) == (2, 1)
    assert (
        0 < during["kv_blocks_used"] < during["kv_blocks_total"] == engine.block_manager.num_blocks
    )
    engine.abort("2")
    while engine.has_unfinished():
        engine.step()
    stats = engine.stats()
    assert stats["requests_running"] == stats["requests_waiting"] == stats["kv_blocks_used"] == 0
    assert stats["finished"] == {"stop": 0, "length": 2, "abort": 1}
    assert stats["prompt_tokens"] == prompt_tokens - len(
        engine.tokenizer.encode("three words here")
    )
    assert stats["generation_tokens"] == 10
    assert stats["time_to_first_token"]["count"] == 2
    assert stats["inter_token_latency"]["count"] == 8
    assert stats["queue_time"]["count"] == 2
    assert stats["e2e_latency"]["count"] == 3
    assert stats["preemptions"] == 0
