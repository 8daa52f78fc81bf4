"""Request parsing alone: what is accepted, and each refusal names its parameter."""

import pytest

from inference.openai.protocol import MAX_CHOICES, MAX_SEED, ProtocolError, load_json
from tests.inference.openai.bodies import parsed_chat, parsed_completion


def test_chat_defaults_and_mapping():
    request = parsed_chat(
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
    assert parsed_chat().max_tokens is None


def test_text_parts_and_developer_role_are_accepted():
    request = parsed_chat(
        messages=[
            {"role": "developer", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ]
    )
    assert request.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "ab"},
    ]


def test_neutral_values_of_unsupported_parameters_are_accepted():
    parsed_chat(n=1, functions=[], suffix="", response_format={"type": "text"})


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
        (  # a tool's answer needs the call it answers (test_tools_parsing.py)
            {"messages": [{"role": "tool", "content": "x"}]},
            "messages[0].tool_call_id",
            "invalid_request",
        ),
        ({"messages": [{"role": {}, "content": "x"}]}, "messages[0].role", "invalid_request"),
        ({"max_tokens": 0}, "max_tokens", "invalid_request"),
        ({"max_completion_tokens": -1}, "max_completion_tokens", "invalid_request"),
        ({"temperature": 3}, "temperature", "invalid_request"),
        ({"temperature": "hot"}, "temperature", "invalid_request"),
        ({"top_p": 0}, "top_p", "invalid_request"),
        ({"best_of": 2}, "best_of", "unsupported_parameter"),  # completions only
        ({"echo": True}, "echo", "unsupported_parameter"),
        ({"presence_penalty": 2.5}, "presence_penalty", "invalid_request"),
        ({"tools": [{"type": "function"}]}, "tools[0].function", "invalid_request"),
        ({"functions": [{"name": "f"}]}, "functions", "unsupported_parameter"),
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
        parsed_chat(**body)
    assert caught.value.param == param and caught.value.code == code
    assert caught.value.message


def test_completion_prompt_forms():
    assert parsed_completion(prompt="x").prompts == ["x"]
    assert parsed_completion(prompt=["x"]).prompts == ["x"]
    assert parsed_completion(prompt=[1, 2]).prompts == [[1, 2]]
    assert parsed_completion(prompt=["a", "b"]).prompts == ["a", "b"]  # a batch
    assert parsed_completion(prompt=[[1], [2, 3]]).prompts == [[1], [2, 3]]
    assert parsed_completion(prompt="x").max_tokens == 16


@pytest.mark.parametrize("prompt", ["", [], [1, -2], None, {"a": 1}, ["a", ""], [[]]])
def test_bad_completion_prompts(prompt):
    with pytest.raises(ProtocolError) as caught:
        parsed_completion(prompt=prompt)
    assert caught.value.param == "prompt"


def test_completion_refuses_suffix_and_tools():
    tools = [{"type": "function", "function": {"name": "f"}}]
    refused = (
        ("suffix", "x"),
        ("tools", tools),
        ("tool_choice", "auto"),
        ("parallel_tool_calls", True),
    )
    for name, value in refused:
        with pytest.raises(ProtocolError) as caught:
            parsed_completion(prompt="x", **{name: value})
        assert caught.value.param == name


@pytest.mark.parametrize("raw", [b"{", b"[1]", b"\xff", b"null"])
def test_invalid_json_is_refused(raw):
    with pytest.raises(ProtocolError) as caught:
        load_json(raw)
    assert caught.value.code == "invalid_json"


# ---------------------------------------------------------------- n and prompt_logprobs


@pytest.mark.parametrize("parse", [parsed_chat, parsed_completion])
def test_n_choices_and_their_seeds(parse):
    assert parse().n == 1 and parse(n=None).n == 1
    request = parse(n=3, seed=7)
    assert request.n == 3
    assert [request.sampling_kwargs(i)["seed"] for i in range(3)] == [7, 8, 9]  # vLLM's rule
    assert parse(n=MAX_CHOICES).n == MAX_CHOICES
    assert parse(n=2).sampling_kwargs(1)["seed"] is None  # the engine draws one per choice
    assert parse(n=4, seed=MAX_SEED - 3).sampling_kwargs(3)["seed"] == MAX_SEED


@pytest.mark.parametrize("parse", [parsed_chat, parsed_completion])
@pytest.mark.parametrize("n", [0, -1, MAX_CHOICES + 1, "3", True, 2.5, [2], {}])
def test_a_bad_n_is_refused_naming_it(parse, n):
    with pytest.raises(ProtocolError) as caught:
        parse(n=n)
    assert caught.value.param == "n" and caught.value.code == "invalid_request"
    assert f"from 1 to {MAX_CHOICES}" in caught.value.message


@pytest.mark.parametrize("parse", [parsed_chat, parsed_completion])
def test_a_seed_whose_last_choice_would_pass_the_largest_is_refused(parse):
    with pytest.raises(ProtocolError) as caught:
        parse(n=3, seed=MAX_SEED - 1)
    assert caught.value.param == "seed"
    assert str(MAX_SEED - 2) in caught.value.message and "seed + i" in caught.value.message
    assert parse(n=1, seed=MAX_SEED).seed == MAX_SEED


@pytest.mark.parametrize("parse", [parsed_chat, parsed_completion])
def test_prompt_logprobs_go_to_the_first_choice_only(parse):
    assert parse().prompt_logprobs is None
    request = parse(prompt_logprobs=2, n=3)
    assert request.prompt_logprobs == 2
    assert [request.sampling_kwargs(i)["prompt_logprobs"] for i in range(3)] == [2, None, None]
    assert parse(prompt_logprobs=0).prompt_logprobs == 0
    assert parse(prompt_logprobs=None, stream=True).prompt_logprobs is None


@pytest.mark.parametrize("parse", [parsed_chat, parsed_completion])
@pytest.mark.parametrize("value", [-1, 21, "1", True, 1.5, [1]])
def test_a_bad_prompt_logprobs_is_refused_naming_it(parse, value):
    with pytest.raises(ProtocolError) as caught:
        parse(prompt_logprobs=value)
    assert caught.value.param == "prompt_logprobs" and "from 0 to 20" in caught.value.message


@pytest.mark.parametrize("parse", [parsed_chat, parsed_completion])
@pytest.mark.parametrize("value", [0, 1])
def test_prompt_logprobs_are_refused_in_a_stream_as_vllm_does(parse, value):
    with pytest.raises(ProtocolError) as caught:
        parse(prompt_logprobs=value, stream=True)
    assert caught.value.param == "prompt_logprobs" and "stream" in caught.value.message
