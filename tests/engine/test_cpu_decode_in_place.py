"""CPU decode with kept per-sequence buffers (decode_buffers.py, model/decode_kv.py): every
step's logits equal those of the path that gathers every key and value from the cache
afresh, and transformers' without any cache, through sequences joining and leaving,
sliding windows, soft-capping, prefix-cache hits, preemption and blocks moved to other
pages; and a join copies the joining sequence's tokens only, a leave copies nothing."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from inference.engine import EngineRequest, LLMEngine, SamplingParams
from inference.engine.block_manager import RELEASED
from inference.engine.decode_buffers import DecodeBufferPlanner
from inference.engine.model.attention import gather_kv
from inference.engine.model.context import DecodeBufferPlan
from inference.engine.model.decode_kv import DecodeKV
from inference.engine.sequence import Sequence, SequenceStatus
from tests.engine.stepping import step_logits
from tests.tiny_llama import make_tiny_llama
from tests.tiny_models import make_tiny_model

PARAMS = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)
EXACT = 2e-6  # fp32: the kept buffers against the gathered copy, same model, same cache
REFERENCE = 1e-4  # against transformers, as the other engine tests compare


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("decode-in-place"), num_layers=2)


class Twins:
    """Two engines on one model stepped in lockstep: `kept` keeps decode buffers, `gathered`
    gathers the decodes' keys and values from the cache every step. Each step's rows are
    compared with each other (and with transformers when given), and both sequences get
    the same next token."""

    def __init__(self, folder, hf=None, **kwargs):
        kwargs.setdefault("block_size", 4)
        kwargs.setdefault("kv_cache_bytes", 1 << 20)
        self.kept = LLMEngine(model=folder, **kwargs)
        self.gathered = LLMEngine(model=folder, **kwargs)
        self.gathered.model_runner.input_builder.decode_buffers.budget_bytes = 0
        self.hf = hf
        self.worst = 0.0

    @property
    def engines(self) -> tuple[LLMEngine, LLMEngine]:
        return self.kept, self.gathered

    def add(self, rid: str, ids: list[int]) -> None:
        for engine in self.engines:
            engine.add_request(EngineRequest(rid, prompt_token_ids=ids, sampling_params=PARAMS))

    def abort(self, rid: str) -> None:
        assert all(engine.abort(rid) for engine in self.engines)

    def step(self) -> list[str]:
        """One step on both; the request ids that got logits."""
        kept, gathered = step_logits(self.kept), step_logits(self.gathered)
        assert [s.request_id for s, _ in kept] == [s.request_id for s, _ in gathered]
        for (seq, row), (twin, expected) in zip(kept, gathered, strict=True):
            torch.testing.assert_close(row, expected, atol=EXACT, rtol=0)
            self.worst = max(self.worst, float((row - expected).abs().max()))
            if self.hf is not None:
                with torch.no_grad():
                    reference = self.hf(torch.tensor([seq.token_ids])).logits[0, -1]
                torch.testing.assert_close(row, reference, atol=REFERENCE, rtol=0)
            token = int(expected.argmax())
            seq.token_ids.append(token)
            twin.token_ids.append(token)
        return [seq.request_id for seq, _ in kept]

    @property
    def copies(self):
        return self.kept.model_runner.kv_copies

    def running(self, rid: str) -> Sequence:
        [seq] = [s for s in self.kept.scheduler.running if s.request_id == rid]
        return seq


def _hf(folder):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 384, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_join_copies_its_own_tokens_and_a_leave_none(llama_dir):
    twins = Twins(llama_dir, _hf(llama_dir))
    twins.add("a", _prompt(13, 0))
    twins.add("b", _prompt(30, 1))
    twins.step()  # both prompts
    twins.step()  # both join the decode batch
    assert twins.copies.copied == (13 + 1 - 1) + (30 + 1 - 1)
    for _ in range(3):
        twins.step()
        assert (twins.copies.copied, twins.copies.moved) == (0, 0)
    twins.add("c", _prompt(9, 2))
    twins.step()  # c's prompt, beside a's and b's decodes: nothing copied
    assert twins.copies.copied == 0
    twins.step()  # c joins: its 9 prompt tokens, not a's or b's
    assert twins.copies.copied == 9
    gathered = twins.gathered.model_runner.kv_copies.copied
    assert gathered >= len(twins.running("a")) + len(twins.running("b")) + 9  # everyone
    twins.abort("b")
    for _ in range(2):  # b left: nobody's tokens move
        assert twins.step() == ["a", "c"]
        assert (twins.copies.copied, twins.copies.moved) == (0, 0)
    twins.add("d", _prompt(21, 3))
    twins.step()
    twins.step()  # d takes a free slot: its tokens only
    assert twins.copies.copied == 21
    assert twins.kept.stats()["decode_kv_copied_tokens"] == 13 + 30 + 9 + 21


def test_buffers_that_grow_move_their_own_sequences_only(llama_dir):
    twins = Twins(llama_dir, _hf(llama_dir))
    planner = twins.kept.model_runner.input_builder.decode_buffers
    planner.headroom = 2
    twins.add("a", _prompt(5, 4))
    twins.add("b", _prompt(70, 5))  # lengths apart: a buffer each
    twins.step()
    twins.step()
    assert len(planner.buffers) == 2
    grew = 0
    for _ in range(12):
        before = {i: (len(b.seats), b.capacity) for i, b in planner.buffers.items()}
        twins.step()
        after = {i: b.capacity for i, b in planner.buffers.items()}
        expected = sum(slots * cap for i, (slots, cap) in before.items() if after[i] != cap)
        assert (twins.copies.moved, twins.copies.copied) == (expected, 0)
        grew += expected > 0
    assert grew >= 2


@pytest.mark.parametrize("family", ["gemma2", "mistral"])
def test_windows_and_softcap_through_joins_and_leaves(tmp_path, family):
    """Gemma 2: soft-capped scores, every other layer sliding; Mistral: every layer
    sliding, so blocks behind the window go back to the pool while the sequence runs."""
    folder = make_tiny_model(tmp_path, family)
    twins = Twins(folder, _hf(folder))
    twins.add("a", _prompt(20, 6))
    twins.add("b", _prompt(3, 7))
    for _ in range(4):
        twins.step()
    twins.add("c", _prompt(13, 8))
    for _ in range(3):
        twins.step()
    twins.abort("a")
    for _ in range(4):
        twins.step()
    if family == "mistral":
        assert RELEASED in twins.running("c").block_table


def test_a_join_with_a_cached_prefix_copies_its_tokens_once(llama_dir):
    twins = Twins(llama_dir, _hf(llama_dir), enable_prefix_caching=True)
    shared = _prompt(40, 9)
    twins.add("a", shared + [5])
    twins.add("b", _prompt(25, 10))
    for _ in range(4):
        twins.step()
    hits = twins.kept.stats()["prefix_cache_hits"]
    twins.add("c", shared + [7, 8])
    twins.step()  # c computes its last tokens only, beside the decodes
    assert twins.kept.stats()["prefix_cache_hits"] == hits + 40
    assert twins.copies.copied == 0
    twins.step()
    assert twins.copies.copied == 42  # its own 40 cached and 2 computed, once
    for _ in range(3):
        twins.step()
        assert twins.copies.copied == 0


def test_preempted_sequences_refill_from_the_recomputed_cache(llama_dir):
    block_bytes = LLMEngine(model=llama_dir, block_size=4, kv_cache_bytes=1 << 20)
    blocks = 14
    kv_bytes = blocks * block_bytes.config.kv_block_bytes
    twins = Twins(llama_dir, _hf(llama_dir), kv_cache_bytes=kv_bytes)
    for i, n in enumerate((12, 10, 9)):
        twins.add(f"r{i}", _prompt(n, 11 + i))
    for _ in range(16):
        twins.step()
    assert twins.kept.scheduler.num_preemptions > 0
    assert twins.kept.scheduler.num_preemptions == twins.gathered.scheduler.num_preemptions


def _migrate(engine: LLMEngine) -> int:
    """Move every running sequence's own blocks to free pages, as a defragmenting pool
    would between steps, and scribble over the pages left; the number moved."""
    manager = engine.scheduler.block_manager
    layers = engine.model_runner.attention_layers
    moved = 0
    for seq in engine.scheduler.running:
        for i, old in enumerate(seq.block_table):
            block = manager.blocks[old] if old != RELEASED else None
            if block is None or block.ref_count != 1 or block.hash is not None:
                continue
            if not manager.free_blocks:
                return moved
            new = manager.free_blocks.take()
            for layer in layers:
                for cache in (layer.k_cache, layer.v_cache):
                    cache[new] = cache[old]
                    cache[old] = 1e3
            manager.blocks[new].ref_count, block.ref_count = 1, 0
            manager.free_blocks.append(old)
            seq.block_table[i] = new
            moved += 1
    return moved


def test_blocks_moved_between_steps_change_nothing(llama_dir):
    twins = Twins(llama_dir, _hf(llama_dir))
    twins.add("a", _prompt(17, 14))
    twins.add("b", _prompt(6, 15))
    for step in range(8):
        if step == 3:
            twins.add("c", _prompt(11, 16))  # prefilled, then joins from moved blocks
        twins.step()
        assert all(_migrate(engine) for engine in twins.engines)


def test_fills_read_a_strided_block_major_cache():
    """A cache laid out [pages, 2, layers, block_size, kv_heads, head_dim], each layer's
    keys a strided view: the fills equal the gathered copy."""
    pages, block_size, kv_heads, head_dim = 9, 4, 2, 8
    cache = torch.randn(pages, 2, 3, block_size, kv_heads, head_dim)
    caches = (cache[:, 0, 1], cache[:, 1, 1])
    assert not caches[0].is_contiguous()
    tables = torch.tensor([[7, 2, 5], [1, 8, 0]])
    plan = DecodeBufferPlan({4: (2, 16)}, fills=[(0, 4, 1, 11), (1, 4, 0, 6)])
    kv = DecodeKV()
    kv.apply(plan, tables, caches)
    assert kv.copied_tokens == 17
    for buffer, layer_cache in zip(kv.buffers[4], caches, strict=True):
        expected = gather_kv(layer_cache, tables, 16)  # head-major, as the buffers
        torch.testing.assert_close(buffer[1, :, :11], expected[0, :, :11], rtol=0, atol=0)
        torch.testing.assert_close(buffer[0, :, :6], expected[1, :, :6], rtol=0, atol=0)
        assert not buffer[1, :, 11:].any() and not buffer[0, :, 6:].any()


def _seqs(*lengths: int) -> list[Sequence]:
    seqs = []
    for i, n in enumerate(lengths):
        seq = Sequence(f"s{i}", list(range(n)), PARAMS, seed=i, detokenizer=None)  # type: ignore[arg-type]
        seq.status = SequenceStatus.RUNNING
        seqs.append(seq)
    return seqs


def test_the_planner_seats_joiners_without_moving_anyone():
    planner = DecodeBufferPlanner(block_size=4, token_bytes=1, budget_bytes=1 << 20)
    seqs = _seqs(*[100] * 9)
    seated = []
    for k in range(1, 10):  # one joins per step, all decoding on
        plan = planner.plan(seqs[:k])
        assert plan is not None
        ordered, groups, shapes = plan
        assert [(row, n) for row, _, _, n in shapes.fills] == [
            (ordered.index(seqs[k - 1]), len(seqs[k - 1]) - 1)
        ]
        assert sum(g.end - g.start for g in groups) == k
        seated.append(sorted(slots for slots, _ in shapes.buffers.values()))
        for seq in seqs[:k]:
            seq.token_ids.append(0)
    assert seated[-1] == [1, 1, 2, 4, 8]  # slots doubled, no buffer resized
    seqs[4].status = SequenceStatus.FINISHED
    running = [s for s in seqs if s is not seqs[4]]
    plan = planner.plan(running)
    assert plan is not None and plan[2].fills == []  # a leave: nothing copied
    assert len(planner.seats) == 8 and seqs[4] not in [s.seq for s in planner.seats.values()]
    for seq in running:
        seq.token_ids.append(0)
    seqs[2].num_preemptions += 1  # recomputed: its slot no longer matches the cache
    plan = planner.plan(running)
    assert plan is not None
    assert [(plan[0][row], n) for row, _, _, n in plan[2].fills] == [(seqs[2], len(seqs[2]) - 1)]


def test_the_planner_groups_similar_lengths_and_keeps_to_its_budget():
    planner = DecodeBufferPlanner(block_size=4, token_bytes=1, budget_bytes=10_000)
    long, short, other = _seqs(400, 390, 40)
    plan = planner.plan([long, short, other])
    assert plan is not None
    _, groups, shapes = plan
    assert len(shapes.buffers) == 2  # 400 and 390 together, 40 apart
    assert sorted(g.width for g in groups) == [40, 400]
    huge = _seqs(9000)[0]
    assert planner.plan([long, short, other, huge]) is None  # beyond the budget: none kept
    assert planner.buffers == {} and planner.seats == {}


def _slots(planner: DecodeBufferPlanner) -> int:
    return sum(len(buffer.seats) for buffer in planner.buffers.values())


def test_a_batch_arriving_at_once_is_seated_without_spare_slots():
    # Lengths spread as a chat benchmark's: each length class gets the slots it needs, so
    # the buffers hold as they grow instead of outgrowing the budget and gathering again.
    lengths = [36, 60, 79, 103, 146, 169, 189, 211, 232, 256, 279, 299, 324, 343, 367, 389]
    seqs = _seqs(*lengths)
    token_bytes = 1
    tight = sum(-(-(n + 64 + 128) // 4) * 4 for n in lengths) * 3 // 2
    planner = DecodeBufferPlanner(block_size=4, token_bytes=token_bytes, budget_bytes=tight)
    first = planner.plan(seqs[:12])
    assert first is not None
    assert _slots(planner) <= 16  # not a buffer of max_slots per length class
    for _ in range(128):
        plan = planner.plan(seqs)
        assert plan is not None
        for seq in seqs:
            seq.token_ids.append(0)
    assert _slots(planner) <= 2 * len(seqs)


def test_buffers_seated_over_time_are_repacked_before_being_dropped():
    planner = DecodeBufferPlanner(block_size=4, token_bytes=1, budget_bytes=3_000)
    seqs = _seqs(*[100] * 8)
    for k in range(1, 9):  # one joins per step: slots double, buffers of 1, 1, 2 and 4
        assert planner.plan(seqs[:k]) is not None
    for seq in seqs[2:4] + seqs[5:]:
        seq.status = SequenceStatus.FINISHED
    running = [seqs[0], seqs[1], seqs[4]]  # one in each buffer left: 6 slots for 3
    assert planner.plan(running) is not None and _slots(planner) == 6
    for seq in running:
        seq.token_ids.extend([0] * 500)  # 6 slots of the new length would not fit
    plan = planner.plan(running)
    assert plan is not None  # repacked tight they fit: kept, every sequence copied in again
    assert sorted(row for row, *_ in plan[2].fills) == [0, 1, 2]
    assert _slots(planner) == 4 and len(planner.buffers) == 1
