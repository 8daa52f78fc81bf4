"""Every number a /v1 body carries has bounds: out of them is a 400 naming the parameter, never a
500 from deep inside torch (a seed of 2**64 overflowed torch.Generator.manual_seed).

Bodies are raw JSON text, as a client sends them: `1e309` is infinity and `NaN` parses.
"""

import pytest

from inference.engine import SamplingParams
from inference.errors import InvalidJson
from inference.openai.protocol import (
    MAX_SEED,
    ProtocolError,
    load_json,
    parse_chat_request,
    parse_completion_request,
)

CHAT = '{"model": "m", "messages": [{"role": "user", "content": "Hi"}], %s}'
TEXT = '{"model": "m", "prompt": "Hi", %s}'
HUGE = "9" * 400  # fits Python's int, no C type


def refused(template: str, field: str) -> ProtocolError:
    parse = parse_chat_request if template is CHAT else parse_completion_request
    with pytest.raises(ProtocolError) as caught:
        parse(load_json((template % field).encode()))
    return caught.value


@pytest.mark.parametrize(
    "field, param",
    [
        ('"seed": 18446744073709551616', "seed"),  # 2**64
        ('"seed": 9223372036854775808', "seed"),  # 2**63
        ('"seed": -1', "seed"),
        (f'"seed": {HUGE}', "seed"),
        ('"seed": 1e309', "seed"),
        ('"seed": NaN', "seed"),
        ('"seed": 3.0', "seed"),
        ('"max_tokens": 2147483648', "max_tokens"),
        (f'"max_tokens": {HUGE}', "max_tokens"),
        ('"max_tokens": 1e309', "max_tokens"),
        ('"max_completion_tokens": -5', "max_completion_tokens"),
        (f'"top_k": {HUGE}', "top_k"),
        ('"top_k": 0', "top_k"),
        ('"top_k": -2', "top_k"),
        ('"temperature": 1e309', "temperature"),
        ('"temperature": NaN', "temperature"),
        ('"temperature": -Infinity', "temperature"),
        (f'"temperature": {HUGE}', "temperature"),
        ('"top_p": NaN', "top_p"),
        ('"top_p": 1e309', "top_p"),
        ('"top_p": 0', "top_p"),
        ('"logprobs": true, "top_logprobs": 21', "top_logprobs"),
        (f'"logprobs": true, "top_logprobs": {HUGE}', "top_logprobs"),
        ('"n": 17', "n"),
        (f'"n": {HUGE}', "n"),
        ('"presence_penalty": NaN', "presence_penalty"),
        ('"frequency_penalty": 1e309', "frequency_penalty"),
        ('"best_of": 1e309', "best_of"),
    ],
)
def test_a_chat_number_out_of_bounds_is_a_400_naming_it(field, param):
    error = refused(CHAT, field)
    assert error.status == 400 and error.param == param, error.message


@pytest.mark.parametrize(
    "field, param",
    [
        ('"seed": 18446744073709551616', "seed"),
        (f'"max_tokens": {HUGE}', "max_tokens"),
        ('"max_tokens": 0', "max_tokens"),
        ('"logprobs": 21', "logprobs"),
        (f'"logprobs": {HUGE}', "logprobs"),
        ('"logprobs": NaN', "logprobs"),
    ],
)
def test_a_completion_number_out_of_bounds_is_a_400_naming_it(field, param):
    error = refused(TEXT, field)
    assert error.status == 400 and error.param == param, error.message


def test_the_largest_seed_accepted_is_one_the_engine_can_seed_with():
    request = parse_chat_request(load_json((CHAT % f'"seed": {MAX_SEED}').encode()))
    assert request.seed == MAX_SEED
    import torch

    torch.Generator().manual_seed(MAX_SEED)  # what the engine does with it
    SamplingParams(**request.sampling_kwargs())
    assert parse_chat_request(load_json((CHAT % '"seed": 0').encode())).seed == 0


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000,  # RecursionError inside json
        b'{"seed": ' + b"1" * 5000 + b"}",  # past Python's 4300-digit limit for int()
        b"\xff\xfe{}",
    ],
)
def test_bodies_json_cannot_take_are_invalid_json(raw):
    with pytest.raises(InvalidJson) as caught:
        load_json(raw)
    assert caught.value.status == 400
