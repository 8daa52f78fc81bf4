"""A long prompt costs the event loop nothing: a length check first, then tokenizing in a thread.

Before, the chat template was rendered and the prompt tokenized on the event loop, before
any length check: a megabyte of prompt (within the body limit) held every other stream of
the process for the best part of a second per request.
"""

import asyncio

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from inference.engine import AsyncLLMEngine, LLMEngine
from inference.engine.tokenizer import Tokenizer
from inference.host.engine_host import HOST, ServedModel
from tests.tiny_llama import make_tiny_llama

MODEL = "tiny-prompts"


@pytest.fixture
def tiny_engine(tmp_path, monkeypatch):
    """This process's engine host, serving a tiny model (no `serve` needed)."""
    from inference import usage

    engine = AsyncLLMEngine(LLMEngine(model=make_tiny_llama(tmp_path), kv_cache_bytes=1 << 20))
    monkeypatch.setattr(HOST, "engine", engine)
    monkeypatch.setattr(HOST, "model", ServedModel(MODEL, "0" * 40, tmp_path))
    monkeypatch.setattr(usage, "record", lambda **fields: None)  # no writer thread here
    yield engine
    engine.shutdown()


@pytest.fixture
def tokenizer_calls(monkeypatch):
    """Every template render and encode: whether it ran on an event loop's thread."""
    calls = []

    def watch(name):
        original = getattr(Tokenizer, name)

        def watched(self, *args, **kwargs):
            calls.append((name, _on_event_loop()))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(Tokenizer, name, watched)

    watch("apply_chat_template")
    watch("encode")
    return calls


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def chat_in_process(key: str, content: str):
    """POST /v1/chat/completions through Django's ASGI test client, to this process's engine."""
    client = AsyncClient()
    return async_to_sync(client.post)(
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2},
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


def test_a_prompt_no_tokenization_could_fit_is_refused_untokenized(
    tiny_engine, tokenizer_calls, tenant_a, make_key
):
    _, key = make_key(tenant_a)
    bound = tiny_engine.engine.max_seq_len * tiny_engine.engine.tokenizer.max_token_chars
    response = chat_in_process(key, "word " * (bound // 5 + 1))
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
    assert tokenizer_calls == []  # before: rendered and tokenized on the loop, then refused


def test_a_prompt_is_rendered_and_tokenized_off_the_event_loop(
    tiny_engine, tokenizer_calls, tenant_a, make_key
):
    _, key = make_key(tenant_a)
    response = chat_in_process(key, "Paris is the capital of France.")
    assert response.status_code == 200, response.content
    assert ("apply_chat_template", False) in tokenizer_calls
    assert ("encode", False) in tokenizer_calls
    assert not any(on_loop for _, on_loop in tokenizer_calls)  # before: all on the loop
