"""The block manager's bookkeeping over the shared pool, under any order of admissions,
growth, finishes, slot groups lent to adapters and given back: every page is in exactly one
state (free, cached, held, lent), a sequence's table names only pages it holds and outside
every lent group, and what a table points at after blocks moved is what was written there;
with the slots reserved, every group stays lent."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from inference.engine import SamplingParams
from inference.engine.block_manager import RELEASED, BlockManager
from inference.engine.memory_pool import FreePages, PoolLayout
from inference.engine.sequence import Sequence

BLOCK = 2
PAGES, SLOTS, PER_SLOT = 24, 3, 5  # groups: pages 0-4, 5-9, 10-14; 15-23 outside
PREFIXES = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9], [7, 7, 7, 7]]
PARAMS = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)


def sequence(rid: int, ids: list[int]) -> Sequence:
    return Sequence(f"s{rid}", ids, PARAMS, seed=0, detokenizer=None)  # type: ignore[arg-type]


class PoolBookkeeping(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.layout = PoolLayout(PAGES, SLOTS, PER_SLOT)
        self.bm = BlockManager(PAGES, BLOCK, layout=self.layout)
        self.running: list[Sequence] = []
        self.written: dict[int, tuple[int, ...]] = {}  # page -> the tokens "stored" there
        self.count = 0

    def _store(self, seq: Sequence) -> None:
        """A forward pass: every block of the sequence gets its tokens' keys and values."""
        for j, page in enumerate(seq.block_table):
            self.written[page] = tuple(seq.token_ids[j * BLOCK : (j + 1) * BLOCK])

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(10, 20), max_size=5))
    def admit(self, prefix: list[int], tail: list[int]) -> None:
        self.count += 1
        seq = sequence(self.count, prefix + tail)
        cached = self.bm.cached_prefix(seq)
        if not self.bm.can_allocate(seq, cached):
            return
        self.bm.allocate(seq, cached)
        self.bm.commit(seq, len(seq))
        self.running.append(seq)
        self._store(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def grow(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.running))
        seq.token_ids.append(30)
        if not self.bm.can_append(seq):
            seq.token_ids.pop()
            return
        self.bm.append_slot(seq)
        self.bm.commit(seq, len(seq))
        self._store(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.running))
        self.running.remove(seq)
        self.bm.free(seq)

    @rule(slot=st.integers(0, SLOTS - 1))
    def lend(self, slot: int) -> None:
        pages = self.layout.slot_pages(slot)
        if slot in self.bm.lent or not self.bm.can_lend(pages):
            return
        moves = self.bm.lend(slot, pages)
        lent = {p for group in self.bm.lent.values() for p in group}
        for src, dst in moves:
            assert src in pages and dst not in lent
            self.written[dst] = self.written[src]  # the page copy the runner makes
        for page in pages:
            self.written.pop(page, None)  # the adapter's weights overwrite the group

    @precondition(lambda self: self.bm.lent)
    @rule(data=st.data())
    def give_back(self, data: st.DataObject) -> None:
        self.bm.give_back(data.draw(st.sampled_from(sorted(self.bm.lent))))

    @invariant()
    def every_page_is_in_one_state(self) -> None:
        bm = self.bm
        free = set(bm.free_blocks.members)
        cached = set(bm.cached_free)
        held = {p for p in range(PAGES) if bm.blocks[p].ref_count > 0}
        lent = [p for group in bm.lent.values() for p in group]
        assert len(lent) == len(set(lent)) == bm.num_lent_pages
        parts = [free, cached, held, set(lent)]
        assert sum(map(len, parts)) == PAGES and set().union(*parts) == set(range(PAGES))
        assert bm.num_used_blocks == len(held)

    @invariant()
    def tables_name_held_pages_with_their_tokens(self) -> None:
        bm = self.bm
        lent = {p for group in bm.lent.values() for p in group}
        refs: dict[int, int] = {}
        for seq in self.running:
            for j, page in enumerate(seq.block_table):
                assert page != RELEASED and page not in lent
                refs[page] = refs.get(page, 0) + 1
                want = tuple(seq.token_ids[j * BLOCK : (j + 1) * BLOCK])
                assert self.written[page][: len(want)] == want
        assert refs == {p: b.ref_count for p, b in enumerate(bm.blocks) if b.ref_count}

    @invariant()
    def prefix_names_point_at_their_blocks(self) -> None:
        for name, page in self.bm.by_hash.items():
            assert self.bm.blocks[page].hash == name
            assert page not in {p for group in self.bm.lent.values() for p in group}


class ReservedPoolBookkeeping(PoolBookkeeping):
    """The same with the slots reserved (a fixed split): every group stays lent whatever
    is given back, so no block ever lands in one."""

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(PAGES, BLOCK, layout=self.layout, reserve_slots=True)

    @invariant()
    def every_group_stays_lent(self) -> None:
        assert self.bm.lent == {s: self.layout.slot_pages(s) for s in range(SLOTS)}
        assert self.bm.max_seq_blocks(True) == self.bm.max_seq_blocks() == PAGES - 15


TestPoolBookkeeping = PoolBookkeeping.TestCase
TestPoolBookkeeping.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestReservedPoolBookkeeping = ReservedPoolBookkeeping.TestCase
TestReservedPoolBookkeeping.settings = TestPoolBookkeeping.settings


def test_free_pages_go_outside_the_groups_first_then_the_highest_group():
    pages = FreePages(PoolLayout(PAGES, SLOTS, PER_SLOT))
    order = [pages.take() for _ in range(PAGES)]
    assert order == list(range(15, 24)) + list(range(10, 15)) + list(range(5, 10)) + list(range(5))
    pages.append(3)
    pages.append(20)
    assert pages.take() == 20 and pages.take() == 3 and len(pages) == 0
