"""Tool calls read out of a choice's text (inference/openai/tool_calls/) on crafted answers: the
random tiny model never writes a call by itself. Every answer is also fed one character at
a time and in two pieces split everywhere: what the stream deltas add up to is always the
message a whole answer gives, and no content is lost or invented."""

import json

import pytest

from inference.openai.tool_calls import (
    AutoCallsReader,
    CallReader,
    ForcedFunctionReader,
    RequiredCallsReader,
)

NAMES = ("get_weather", "get_time")


def read(reader: CallReader, pieces: list[str]) -> tuple[str | None, list[dict], list[dict]]:
    """(content, calls, the stream's tool-call entries) after feeding `pieces`; checks that the
    streamed content equals the message's."""
    streamed, entries = "", []
    for piece in pieces:
        delta = reader.feed(piece)
        streamed += delta.content
        entries += delta.tool_calls
    delta = reader.finish()
    streamed += delta.content
    entries += delta.tool_calls
    assert streamed == (reader.content or "")
    return reader.content, reader.calls, entries


def accumulate(entries: list[dict]) -> list[dict]:
    """What a client rebuilds from stream entries (as the openai client does)."""
    calls: dict[int, dict] = {}
    for entry in entries:
        call = calls.setdefault(
            entry["index"], {"id": None, "type": None, "function": {"name": "", "arguments": ""}}
        )
        call["id"] = entry.get("id", call["id"])
        call["type"] = entry.get("type", call["type"])
        call["function"]["name"] += entry["function"].get("name", "")
        call["function"]["arguments"] += entry["function"].get("arguments", "")
    return [calls[i] for i in sorted(calls)]


def splits(text: str) -> list[list[str]]:
    return [list(text), [text]] + [[text[:i], text[i:]] for i in range(1, len(text))]


def check_every_split(make_reader, text: str) -> tuple[str | None, list[tuple[str, dict]]]:
    """(content, [(name, arguments)]), the same however the text arrives."""
    results = set()
    for pieces in splits(text):
        content, calls, entries = read(make_reader(), pieces)
        assert accumulate(entries) == calls
        assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
        named = tuple(
            (c["function"]["name"], json.dumps(json.loads(c["function"]["arguments"])))
            for c in calls
        )
        results.add((content, named))
    assert len(results) == 1, results
    content, named = results.pop()
    return content, [(name, json.loads(arguments)) for name, arguments in named]


def auto(parallel=True):
    return lambda: AutoCallsReader(NAMES, parallel=parallel)


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL2 = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


@pytest.mark.parametrize(
    "text, content, calls",
    [
        (CALL, None, [("get_weather", {"city": "Paris"})]),
        (
            f"{CALL}\n{CALL2}\n",
            None,
            [("get_weather", {"city": "Paris"}), ("get_time", {})],
        ),
        (
            f"Let me check.\n{CALL}\nOne moment.",
            "Let me check.\nOne moment.",
            [("get_weather", {"city": "Paris"})],
        ),
        ("It is sunny in Paris.", "It is sunny in Paris.", []),
        ("Trailing space stays  \n", "Trailing space stays  \n", []),
        ("a < b and <tool> is not a call", "a < b and <tool> is not a call", []),
        # not a call of one of the tools, or not a call at all: the block stays content
        (
            '<tool_call>{"name": "get_money", "arguments": {}}</tool_call>',
            '<tool_call>{"name": "get_money", "arguments": {}}</tool_call>',
            [],
        ),
        ("<tool_call>not json</tool_call> ok", "<tool_call>not json</tool_call> ok", []),
        (
            '<tool_call>{"name": "get_time", "arguments": "now"}</tool_call>',
            '<tool_call>{"name": "get_time", "arguments": "now"}</tool_call>',
            [],
        ),
        # cut short (max_tokens) inside a call: what came is content
        ('Sure <tool_call>{"name": "get_ti', 'Sure <tool_call>{"name": "get_ti', []),
        ("ends with <tool_", "ends with <tool_", []),
        # Llama 3.1's JSON calls: the whole answer
        (
            '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
            None,
            [("get_weather", {"city": "Oslo"})],
        ),
        (
            ' [{"name": "get_time", "parameters": {}},'
            ' {"name": "get_weather", "arguments": {"city": "Rome"}}]',
            None,
            [("get_time", {}), ("get_weather", {"city": "Rome"})],
        ),
        ('{"answer": 42}', '{"answer": 42}', []),
        (
            '{"name": "get_time", "parameters": {}} and more',
            '{"name": "get_time", "parameters": {}} and more',
            [],
        ),
        ("[1, 2]", "[1, 2]", []),
        ("   ", "   ", []),
    ],
)
def test_auto_reads_hermes_and_llama_calls_however_the_text_arrives(text, content, calls):
    assert check_every_split(auto(), text) == (content, calls)


def test_without_parallel_calls_only_the_first_call_is_one():
    content, calls = check_every_split(auto(parallel=False), f"{CALL}\n{CALL2}")
    assert calls == [("get_weather", {"city": "Paris"})]
    assert content == "\n" + CALL2  # the second stays as written
    llama = '[{"name": "get_time", "parameters": {}}, {"name": "get_time", "parameters": {}}]'
    assert check_every_split(auto(parallel=False), llama) == (llama, [])


def test_content_before_a_call_streams_before_the_call_completes():
    reader = AutoCallsReader(NAMES)
    assert reader.feed("Let me look that up. <tool").content == "Let me look that up."
    assert reader.feed('_call>{"name": "get_time", ').content == ""
    delta = reader.feed('"arguments": {}}</tool_call>')
    assert delta.tool_calls[0]["function"] == {"name": "get_time", "arguments": "{}"}


@pytest.mark.parametrize(
    "engine_reason, reason",
    [("stop", "tool_calls"), ("length", "length"), ("abort", "abort")],
)
def test_the_finish_reason_is_tool_calls_when_an_answer_with_calls_ended_by_itself(
    engine_reason, reason
):
    reader = AutoCallsReader(NAMES)
    read(reader, [CALL])
    assert reader.finish_reason(engine_reason) == reason
    plain = AutoCallsReader(NAMES)
    read(plain, ["no call"])
    assert plain.finish_reason("stop") == "stop"


def test_a_forced_function_streams_its_arguments_as_they_come():
    reader = ForcedFunctionReader("get_weather")
    content, calls, entries = read(reader, ['{"city"', ': "Pa', 'ris"}'])
    assert content is None
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert entries[0]["id"] == calls[0]["id"] and entries[0]["function"]["name"] == "get_weather"
    assert [e["function"]["arguments"] for e in entries] == ['{"city"', ': "Pa', 'ris"}']
    assert all(set(e) == {"index", "function"} for e in entries[1:])
    assert reader.finish_reason("stop") == "tool_calls"
    assert accumulate(entries) == calls


REQUIRED = (
    '[{"name": "get_weather", "arguments": {"city": "a \\" ] } [ {"}}, '
    '{"name": "get_time", "arguments": {}}]'
)


def test_required_sends_each_call_once_its_element_closes():
    content, calls = check_every_split(lambda: RequiredCallsReader(NAMES), REQUIRED)
    assert content is None
    assert calls == [("get_weather", {"city": 'a " ] } [ {'}), ("get_time", {})]
    reader = RequiredCallsReader(NAMES)
    first_ends = REQUIRED.index("}}, ") + 2
    assert reader.feed(REQUIRED[: first_ends - 1]).tool_calls == []
    assert reader.feed(REQUIRED[first_ends - 1 : -3]).tool_calls[0]["index"] == 0
    assert reader.feed(REQUIRED[-3:]).tool_calls[0]["function"]["name"] == "get_time"


def test_required_cut_short_keeps_the_unfinished_call_as_content():
    text = REQUIRED[: REQUIRED.index("get_time")]
    content, calls = check_every_split(lambda: RequiredCallsReader(NAMES), text)
    assert calls == [("get_weather", {"city": 'a " ] } [ {'})]
    assert content == '{"name": "'


def test_a_forced_call_cut_by_a_stop_string_does_not_end_as_a_call():
    reader = ForcedFunctionReader("get_weather")
    read(reader, ['{"city": "Pa'])
    assert reader.finish_reason("stop") == "stop"
    assert reader.finish_reason("length") == "length"
