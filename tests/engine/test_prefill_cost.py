"""A prefill chunk's cost by its position, and the tokens a cost pays for: the most whose
cost fits, at every position, with and without attention counted."""

from hypothesis import given
from hypothesis import strategies as st

from inference.engine.model_config import ModelConfig
from inference.engine.prefill_cost import PrefillCost

contexts = st.one_of(st.none(), st.integers(1, 10_000))


@given(contexts, st.integers(0, 200_000), st.integers(0, 5_000))
def test_tokens_within_is_the_most_that_fit(context, start, cost):
    pricing = PrefillCost(context)
    n = pricing.tokens_within(start, cost)
    assert pricing.of(start, n) <= cost
    assert pricing.of(start, n + 1) > cost


@given(contexts, st.integers(0, 200_000), st.integers(1, 5_000))
def test_a_token_costs_one_at_least_and_more_the_deeper_it_is(context, start, tokens):
    pricing = PrefillCost(context)
    assert pricing.of(start, tokens) >= tokens
    assert pricing.of(start + 1, tokens) >= pricing.of(start, tokens)
    if context is None:
        assert pricing.of(start, tokens) == tokens


def test_a_chunk_deep_in_a_long_prompt_costs_its_attention_too():
    pricing = PrefillCost(3072)
    assert pricing.of(0, 512) == 512 + -(-(512 * 511 // 2) // 3072)
    assert pricing.of(7_000, 512) > 3 * 512
    assert pricing.tokens_within(7_000, 512) < 512 // 3 + 1


def test_the_context_is_where_attention_costs_as_much_as_the_linear_layers(lora_model_dir):
    config = ModelConfig.from_folder(lora_model_dir)
    context = config.attention_cost_context
    q_width = config.num_heads * config.head_dim
    kv_width = config.num_kv_heads * config.head_dim
    linear = config.hidden_size * (2 * q_width + 2 * kv_width + 3 * config.intermediate_size)
    assert abs(2 * q_width * context - linear) < 2 * q_width
