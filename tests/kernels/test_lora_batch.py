"""make_lora_batch groups tokens by slot, and refuses slots it cannot serve."""

import pytest
import torch

from inference.kernels import make_lora_batch


def test_tokens_are_grouped_by_slot_in_a_stable_order_without_idle_tokens():
    batch = make_lora_batch(torch.tensor([3, -1, 0, 3, -1, 0, 1]), backend="torch")
    assert batch.segments == ((0, 0, 2), (1, 2, 1), (3, 3, 2))
    assert batch.sorted_token_ids.tolist() == [2, 5, 6, 0, 3]
    assert batch.seg_slots.tolist() == [0, 1, 3]
    assert batch.seg_starts.tolist() == [0, 2, 3]
    assert batch.seg_lens.tolist() == [2, 1, 2]
    assert batch.token_slots.tolist() == [3, -1, 0, 3, -1, 0, 1]
    assert (batch.num_tokens, batch.max_seg_len, batch.max_slot) == (7, 2, 3)


def test_the_batch_can_be_built_from_host_slots_for_another_device():
    batch = make_lora_batch(torch.tensor([1, 0]), device="meta", backend="torch")
    assert batch.device == torch.device("meta")
    assert batch.seg_slots.device == torch.device("meta")
    assert batch.segments == ((0, 0, 1), (1, 1, 1))


def test_a_batch_without_adapters_has_no_segments():
    batch = make_lora_batch(torch.tensor([-1, -1], dtype=torch.int32), backend="torch")
    assert batch.num_segments == 0
    assert batch.max_slot == -1
    assert batch.sorted_token_ids.numel() == 0


def test_an_empty_batch_is_allowed():
    batch = make_lora_batch(torch.empty(0, dtype=torch.int64), backend="torch")
    assert (batch.num_tokens, batch.num_segments) == (0, 0)


def test_the_path_follows_tokens_per_adapter():
    assert make_lora_batch(torch.zeros(16, dtype=torch.int64), backend="torch").path == "sgmv"
    assert make_lora_batch(torch.arange(16), backend="torch").path == "bgmv"
    assert make_lora_batch(torch.arange(16), backend="torch", path="sgmv").path == "sgmv"


@pytest.mark.parametrize(
    ("token_slots", "message"),
    [
        (torch.tensor([0, -2]), "token slot -2 is invalid"),
        (torch.tensor([[0, 1]]), "must be 1-D"),
        (torch.tensor([0.0, 1.0]), "integer tensor"),
        (torch.tensor([True]), "integer tensor"),
        ([0, 1], "must be a torch.Tensor"),
    ],
)
def test_bad_token_slots_raise_a_value_error(token_slots, message):
    with pytest.raises(ValueError, match=message):
        make_lora_batch(token_slots, backend="torch")


def test_an_unknown_path_or_backend_is_refused():
    with pytest.raises(ValueError, match="not a LoRA kernel path"):
        make_lora_batch(torch.tensor([0]), path="punica")
    with pytest.raises(ValueError, match="not a kernel backend"):
        make_lora_batch(torch.tensor([0]), backend="cuda")


def test_a_batch_that_pads_badly_runs_as_groups_of_similar_segments():
    """A prefill beside decodes: the decodes pad together, the prefills apart; the groups
    keep every token and its slot, once, and each pads well or is one segment."""
    slots = torch.cat([torch.full((300,), 0), torch.tensor([1, -1, 2, 2, 3]), torch.full((9,), 4)])
    batch = make_lora_batch(slots, backend="torch")
    assert not batch.pads_well()
    groups = batch.padding_groups
    assert [sorted(length for _, _, length in g.segments) for g in groups] == [[1, 1, 2, 9], [300]]
    seen = torch.full_like(slots, -1)
    for group in groups:
        assert group.num_tokens == slots.numel()
        assert group.pads_well() or group.num_segments == 1
        active = group.token_slots != -1
        assert (seen[active] == -1).all()  # no token in two groups
        seen[active] = group.token_slots[active]
    assert torch.equal(seen, slots)


def test_a_batch_that_pads_well_is_its_own_only_group():
    batch = make_lora_batch(torch.tensor([0, 1, 1, 2, 2, 2, -1]), backend="torch")
    assert batch.pads_well()
    (group,) = batch.padding_groups
    assert group is batch


def test_the_slot_span_runs_from_the_lowest_slot_used_to_the_highest():
    batch = make_lora_batch(torch.tensor([7, -1, 4, 9, 4]), backend="torch")
    assert (batch.min_slot, batch.max_slot, batch.slot_span) == (4, 9, 6)
    m = batch.max_seg_len  # 2: slot 4's two tokens
    assert batch.slot_rows.tolist() == [0, 1, 3 * m, 5 * m]  # by slot: 4, 4, 7, 9
    empty = make_lora_batch(torch.tensor([-1, -1]), backend="torch")
    assert (empty.min_slot, empty.slot_span) == (-1, 0)
