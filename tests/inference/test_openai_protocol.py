"""Request parsing alone: what is accepted, and each refusal names its parameter."""

import pytest

from inference.openai_protocol import (
    ProtocolError,
    load_json,
    parse_chat_request,
    parse_completion_request,
)

USER = [{"role": "user", "content": "Hi"}]


def chat(**body):
    return parse_chat_request({"model": "m", "messages": USER, **body})


def test_chat_defaults_and_mapping():
    request = chat(
        max_completion_tokens=5,
        temperature=0,
        stop="\n",
        seed=7,
        logprobs=True,
        top_logprobs=3,
        stream=True,
        stream_options={"include_usage": True},
        user="someone",
    )
    assert request.max_tokens == 5 and request.stop == ["\n"] and request.logprobs == 3
    assert request.stream and request.include_usage
    assert request.sampling_kwargs()["temperature"] == 0 and request.sampling_kwargs()["seed"] == 7


def test_chat_without_max_tokens_runs_to_the_context_end():
    assert chat().max_tokens is None


def test_text_parts_and_developer_role_are_accepted():
    request = parse_chat_request(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
        }
    )
    assert request.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "ab"},
    ]


def test_neutral_values_of_unsupported_parameters_are_accepted():
    chat(
        n=1,
        presence_penalty=0,
        frequency_penalty=0.0,
        logit_bias={},
        response_format={"type": "text"},
    )


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"messages": []}, "messages", "invalid_request"),
        ({"messages": None}, "messages", "invalid_request"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "invalid_request"),
        (
            {"messages": [{"role": "user", "content": "  "}]},
            "messages[0].content",
            "invalid_request",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content",
            "invalid_request",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "invalid_request"),
        ({"messages": [{"role": {}, "content": "x"}]}, "messages[0].role", "invalid_request"),
        ({"max_tokens": 0}, "max_tokens", "invalid_request"),
        ({"max_completion_tokens": -1}, "max_completion_tokens", "invalid_request"),
        ({"temperature": 3}, "temperature", "invalid_request"),
        ({"temperature": "hot"}, "temperature", "invalid_request"),
        ({"top_p": 0}, "top_p", "invalid_request"),
        ({"n": 2}, "n", "unsupported_parameter"),
        ({"presence_penalty": 0.5}, "presence_penalty", "unsupported_parameter"),
        ({"tools": [{"type": "function"}]}, "tools", "unsupported_parameter"),
        ({"frobnicate": True}, "frobnicate", "unknown_parameter"),
        ({"top_logprobs": 2}, "top_logprobs", "invalid_request"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "invalid_request"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_request"),
        ({"stop": [""]}, "stop", "invalid_request"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_request"),
        ({"seed": 1.5}, "seed", "invalid_request"),
        ({"model": ""}, "model", "invalid_request"),
    ],
)
def test_bad_chat_requests_name_the_parameter(body, param, code):
    with pytest.raises(ProtocolError) as caught:
        parse_chat_request({"model": "m", "messages": USER, **body})
    assert caught.value.param == param and caught.value.code == code
    assert caught.value.message


def test_completion_prompt_forms():
    assert parse_completion_request({"model": "m", "prompt": "x"}).prompt == "x"
    assert parse_completion_request({"model": "m", "prompt": ["x"]}).prompt == "x"
    assert parse_completion_request({"model": "m", "prompt": [1, 2]}).prompt == [1, 2]
    assert parse_completion_request({"model": "m", "prompt": "x"}).max_tokens == 16


@pytest.mark.parametrize("prompt", ["", [], ["a", "b"], [1, -2], None, {"a": 1}])
def test_bad_completion_prompts(prompt):
    with pytest.raises(ProtocolError) as caught:
        parse_completion_request({"model": "m", "prompt": prompt})
    assert caught.value.param == "prompt"


def test_completion_refuses_echo_and_suffix():
    for name, value in (("echo", True), ("suffix", "x"), ("best_of", 3)):
        with pytest.raises(ProtocolError) as caught:
            parse_completion_request({"model": "m", "prompt": "x", name: value})
        assert caught.value.param == name


@pytest.mark.parametrize("raw", [b"{", b"[1]", b"\xff", b"null"])
def test_invalid_json_is_refused(raw):
    with pytest.raises(ProtocolError) as caught:
        load_json(raw)
    assert caught.value.code == "invalid_json"
