"""Penalties, logit_bias and vLLM's sampling extras as request bodies carry them: what each
becomes in SamplingParams, and every bad value a 400 naming its parameter."""

import pytest

from inference.engine import SamplingParams
from inference.openai.protocol import ProtocolError, load_json, parse_chat_request
from inference.openai.sampling_options import (
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_STOP_TOKEN_IDS,
    SamplingOptions,
    check_min_tokens,
    check_token_ids,
    parse_sampling_options,
)
from tests.inference.openai.bodies import parsed_chat, parsed_completion

EVERYTHING = {
    "presence_penalty": 0.5,
    "frequency_penalty": -1,
    "logit_bias": {"17": 100, "3": -100, "0": 2.5},
    "repetition_penalty": 1.2,
    "min_p": 0.05,
    "min_tokens": 3,
    "stop_token_ids": [2, 9],
    "skip_special_tokens": False,
    "include_stop_str_in_output": True,
}


@pytest.mark.parametrize("parse", [parsed_chat, parsed_completion])
def test_both_endpoints_take_every_option_into_the_sampling_params(parse):
    request = parse(**EVERYTHING, top_k=5, ignore_eos=True, max_tokens=8)
    params = SamplingParams(max_tokens=8, **request.sampling_kwargs())
    assert params.presence_penalty == 0.5 and params.frequency_penalty == -1.0
    assert params.logit_bias == {17: 100.0, 3: -100.0, 0: 2.5}
    assert params.repetition_penalty == 1.2 and params.min_p == 0.05
    assert params.min_tokens == 3 and params.stop_token_ids == [2, 9]
    assert params.skip_special_tokens is False and params.include_stop_str_in_output is True
    assert params.top_k == 5 and params.ignore_eos is True


def test_left_out_or_null_is_neutral():
    assert parsed_chat().sampling == SamplingOptions()
    nulls = parsed_chat(**dict.fromkeys(EVERYTHING)).sampling
    assert nulls == SamplingOptions()
    assert not SamplingParams(
        **parsed_chat(**dict.fromkeys(EVERYTHING)).sampling_kwargs()
    ).adjusts_logits


def test_each_choice_gets_its_own_copy():
    request = parsed_chat(logit_bias={"5": 1}, stop_token_ids=[4], n=2)
    first, second = request.sampling_kwargs(0), request.sampling_kwargs(1)
    first["logit_bias"][6] = 2.0
    first["stop_token_ids"].append(7)
    assert second["logit_bias"] == {5: 1.0} and second["stop_token_ids"] == [4]


@pytest.mark.parametrize(
    "field, value",
    [
        ("presence_penalty", 2.01),
        ("presence_penalty", "0.5"),
        ("presence_penalty", True),
        ("frequency_penalty", -2.5),
        ("frequency_penalty", [1]),
        ("repetition_penalty", 0),
        ("repetition_penalty", -1),
        ("repetition_penalty", 101),
        ("repetition_penalty", "1.1"),
        ("min_p", 1.01),
        ("min_p", -0.1),
        ("min_p", "0.1"),
        ("min_tokens", -1),
        ("min_tokens", 1.5),
        ("min_tokens", True),
        ("min_tokens", 2**31),
        ("logit_bias", [1, 2]),
        ("logit_bias", "17:100"),
        ("logit_bias", {"17": 101}),
        ("logit_bias", {"17": -100.5}),
        ("logit_bias", {"17": "100"}),
        ("logit_bias", {"17": None}),
        ("logit_bias", {"17": True}),
        ("logit_bias", {"-1": 1}),
        ("logit_bias", {"1.5": 1}),
        ("logit_bias", {"abc": 1}),
        ("logit_bias", {" 7": 1}),
        ("logit_bias", {"١٢": 1}),  # Arabic-Indic digits: str.isdigit, but no token id
        ("logit_bias", {"9" * 400: 1}),
        ("logit_bias", {str(i): 1 for i in range(MAX_LOGIT_BIAS_ENTRIES + 1)}),
        ("stop_token_ids", 5),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", ["5"]),
        ("stop_token_ids", [1.0]),
        ("stop_token_ids", [True]),
        ("stop_token_ids", list(range(MAX_STOP_TOKEN_IDS + 1))),
        ("skip_special_tokens", "false"),
        ("skip_special_tokens", 0),
        ("include_stop_str_in_output", 1),
    ],
)
@pytest.mark.parametrize("parse", [parsed_chat, parsed_completion])
def test_a_bad_value_is_a_400_naming_its_parameter(parse, field, value):
    with pytest.raises(ProtocolError) as caught:
        parse(**{field: value})
    error = caught.value
    assert error.status == 400 and error.param == field and error.code == "invalid_request"
    assert field in error.message


@pytest.mark.parametrize(
    "raw, param",
    [
        ('"presence_penalty": Infinity', "presence_penalty"),
        ('"repetition_penalty": 1e309', "repetition_penalty"),
        ('"repetition_penalty": NaN', "repetition_penalty"),
        ('"min_p": NaN', "min_p"),
        ('"logit_bias": {"5": NaN}', "logit_bias"),
        ('"logit_bias": {"5": -Infinity}', "logit_bias"),
        ('"min_tokens": 1e309', "min_tokens"),
    ],
)
def test_numbers_json_reads_but_no_sampler_can_use_are_refused(raw, param):
    body = '{"model": "m", "messages": [{"role": "user", "content": "Hi"}], ' + raw + "}"
    with pytest.raises(ProtocolError) as caught:
        parse_chat_request(load_json(body.encode()))
    assert caught.value.param == param


def test_the_bounds_themselves_are_accepted():
    options = parse_sampling_options(
        {
            "presence_penalty": -2,
            "frequency_penalty": 2,
            "repetition_penalty": 100,
            "min_p": 1,
            "logit_bias": {str(i): (-1) ** i * 100 for i in range(MAX_LOGIT_BIAS_ENTRIES)},
            "stop_token_ids": list(range(MAX_STOP_TOKEN_IDS)),
        }
    )
    SamplingParams(**options.sampling_kwargs())  # and the engine takes them as they are


def test_token_ids_are_checked_against_the_vocabulary():
    check_token_ids(parse_sampling_options({"logit_bias": {"99": 1}, "stop_token_ids": [99]}), 100)
    for body, param in (
        ({"logit_bias": {"5": 1, "100": 1}}, "logit_bias"),
        ({"stop_token_ids": [3, 100]}, "stop_token_ids"),
    ):
        with pytest.raises(ProtocolError) as caught:
            check_token_ids(parse_sampling_options(body), 100)
        assert caught.value.param == param and "100" in caught.value.message


def test_min_tokens_above_max_tokens_is_a_400_naming_min_tokens():
    options = parse_sampling_options({"min_tokens": 9})
    check_min_tokens(options, 9, "max_tokens")
    with pytest.raises(ProtocolError) as caught:
        check_min_tokens(options, 8, "max_completion_tokens")
    assert caught.value.param == "min_tokens"
    assert "max_completion_tokens is 8" in caught.value.message
