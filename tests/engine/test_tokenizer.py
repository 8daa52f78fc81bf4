"""The engine's tokenizer agrees with transformers, renders chat templates, streams text safely."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.engine.tokenizer import REPLACEMENT_CHAR, Tokenizer, TokenizerError
from tests.smollm2 import GGUF_NAME, PRESET, smollm2_dir

TEXTS = [
    "Hello, world! How are you today?",
    "naïve café, crème brûlée, Ærøskøbing",
    "日本語のテキストと中文文本",
    "Emoji: 😀👍🏽 family 👨‍👩‍👧 flag 🇫🇷",
    "def add(a, b):\n    return a + b  # 42\n\n\tprint(add(1, 23))",
    "Year 2024: 3.14159 and 1,000,000 items",
    "<|im_start|>user\nhi<|im_end|>\n",
    "  leading and trailing spaces  \n\n",
]
SYSTEM_USER = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the capital of France?"},
]
MULTI_TURN = [
    {"role": "user", "content": "Hi! 👋"},
    {"role": "assistant", "content": "Hello. How can I help?"},
    {"role": "user", "content": "Translate 'cat' into Japanese."},
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_folder(smollm2_dir())


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir())


@pytest.fixture(scope="module")
def hf_gguf_tokenizer():
    """transformers' own reading of the GGUF: a reference independent of our converter."""
    from transformers import AutoTokenizer

    from inference.engine.formats.convert import preset_gguf_path

    return AutoTokenizer.from_pretrained(preset_gguf_path(PRESET).parent, gguf_file=GGUF_NAME)


def copy_folder(tmp_path: Path, **config_changes) -> Path:
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_dir() / name, folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(config_changes)
    config = {k: v for k, v in config.items() if v is not None}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


# --- encode / decode ---------------------------------------------------------------------------


def test_smollm2_special_ids_and_vocab(tokenizer):
    assert tokenizer.vocab_size == 49152
    assert tokenizer.bos_token_id == 1
    assert tokenizer.eos_token_ids == [2]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(tokenizer, hf_tokenizer, hf_gguf_tokenizer, text):
    ids = tokenizer.encode(text)
    assert ids == hf_tokenizer.encode(text)
    assert ids == hf_gguf_tokenizer.encode(text)
    assert tokenizer.encode(text, add_special_tokens=False) == hf_tokenizer.encode(
        text, add_special_tokens=False
    )


@pytest.mark.parametrize("text", TEXTS)
def test_decode_matches_transformers(tokenizer, hf_tokenizer, text):
    ids = tokenizer.encode(text)
    for skip in (True, False):
        assert tokenizer.decode(ids, skip_special_tokens=skip) == hf_tokenizer.decode(
            ids, skip_special_tokens=skip
        )
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_digits_are_split_one_by_one_like_smollm2(tokenizer):
    assert len(tokenizer.encode("12345")) == 5


def test_special_token_text_stays_one_token(tokenizer):
    assert tokenizer.encode("<|im_start|>") == [1]


def test_out_of_vocabulary_id_is_refused(tokenizer):
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tokenizer.decode([5, 49152])
    with pytest.raises(TokenizerError, match="must be ints"):
        tokenizer.decode([1.5])


def test_encoding_a_non_string_is_refused(tokenizer):
    with pytest.raises(TokenizerError, match="needs a str"):
        tokenizer.encode(["hello"])


# --- chat templates ----------------------------------------------------------------------------


@pytest.mark.parametrize("messages", [SYSTEM_USER, MULTI_TURN], ids=["system-user", "multi-turn"])
def test_chat_template_matches_transformers(tokenizer, hf_tokenizer, hf_gguf_tokenizer, messages):
    ours = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    for reference in (hf_tokenizer, hf_gguf_tokenizer):
        assert ours == reference.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
    assert ours.endswith("<|im_start|>assistant\n")


def test_chat_template_without_generation_prompt(tokenizer, hf_tokenizer):
    ours = tokenizer.apply_chat_template(MULTI_TURN, add_generation_prompt=False)
    assert ours == hf_tokenizer.apply_chat_template(MULTI_TURN, tokenize=False)


def test_template_raise_exception_becomes_tokenizer_error(tmp_path):
    template = (
        "{% if messages[0]['role'] != 'user' %}"
        "{{ raise_exception('first turn must be user') }}{% endif %}ok"
    )
    tok = Tokenizer.from_folder(copy_folder(tmp_path, chat_template=template))
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(TokenizerError, match="first turn must be user"):
        tok.apply_chat_template([{"role": "assistant", "content": "x"}])


def test_template_helpers_and_special_tokens_are_available(tmp_path):
    template = "{{ bos_token }}{{ strftime_now('%Y')|length }}{{ messages|tojson }}{{ eos_token }}"
    tok = Tokenizer.from_folder(copy_folder(tmp_path, chat_template=template))
    text = tok.apply_chat_template([{"role": "user", "content": "café <b>"}])
    assert text == '<|im_start|>4[{"role": "user", "content": "café <b>"}]<|im_end|>'


def test_messages_the_template_cannot_render_are_refused(tokenizer):
    with pytest.raises(TokenizerError, match="could not render"):
        tokenizer.apply_chat_template([{"role": "user", "content": 42}])
    with pytest.raises(TokenizerError, match="non-empty list"):
        tokenizer.apply_chat_template([])
    with pytest.raises(TokenizerError, match=r"messages\[1\]"):
        tokenizer.apply_chat_template([{"role": "user", "content": "a"}, {"content": "b"}])


def test_missing_chat_template_is_refused(tmp_path):
    tok = Tokenizer.from_folder(copy_folder(tmp_path, chat_template=None))
    with pytest.raises(TokenizerError, match="no chat template"):
        tok.apply_chat_template(SYSTEM_USER)


def test_chat_template_jinja_file_takes_precedence(tmp_path):
    folder = copy_folder(tmp_path)
    (folder / "chat_template.jinja").write_text("{{ messages|length }} turns")
    assert Tokenizer.from_folder(folder).apply_chat_template(MULTI_TURN) == "3 turns"


# --- eos ids -----------------------------------------------------------------------------------


def test_eos_ids_merge_tokenizer_config_and_generation_config(tmp_path):
    folder = copy_folder(tmp_path)
    (folder / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert Tokenizer.from_folder(folder).eos_token_ids == [2, 0]


# --- incremental detokenizer -------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_detokenizer_stream_equals_decode_without_broken_characters(tokenizer, text):
    ids = tokenizer.encode(text)
    stream = tokenizer.detokenizer()
    pieces = [stream.push(token_id) for token_id in ids]
    pieces.append(stream.flush())
    assert all(REPLACEMENT_CHAR not in piece for piece in pieces)
    assert "".join(pieces) == stream.text == tokenizer.decode(ids)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ids=st.lists(
        # ids 17..272 are SmolLM2's single-byte tokens: they build (and break) multi-byte chars
        st.one_of(st.integers(0, 49151), st.integers(17, 272)),
        max_size=24,
    )
)
def test_detokenizer_stream_equals_decode_for_any_ids(tokenizer, ids):
    # Generated ids need not spell valid UTF-8 at all; the stream must still add up to decode().
    stream = tokenizer.detokenizer()
    pieces = [stream.push(token_id) for token_id in ids]
    assert "".join(pieces) + stream.flush() == tokenizer.decode(ids)


def test_detokenizer_holds_back_half_an_emoji(tokenizer):
    ids = tokenizer.encode("😀")
    assert len(ids) > 1  # byte-level BPE splits this emoji across tokens
    stream = tokenizer.detokenizer()
    assert [stream.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert stream.push(ids[-1]) == "😀"


def test_detokenizer_flush_emits_a_dangling_partial_character(tokenizer):
    ids = tokenizer.encode("😀")[:-1]
    stream = tokenizer.detokenizer()
    assert "".join(stream.push(i) for i in ids) == ""
    assert stream.flush() == tokenizer.decode(ids)
    assert stream.text.endswith(REPLACEMENT_CHAR)


def test_detokenizer_refuses_an_unknown_id(tokenizer):
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tokenizer.detokenizer().push(-1)


# --- malformed folders -------------------------------------------------------------------------


def test_missing_folder_is_refused(tmp_path):
    with pytest.raises(TokenizerError, match="not found"):
        Tokenizer.from_folder(tmp_path / "absent")


def test_folder_without_tokenizer_json_is_refused(tmp_path):
    with pytest.raises(TokenizerError, match="tokenizer.json is missing"):
        Tokenizer.from_folder(tmp_path)


def test_corrupt_tokenizer_json_is_refused(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": ')
    with pytest.raises(TokenizerError, match="not a valid tokenizer"):
        Tokenizer.from_folder(tmp_path)


def test_corrupt_tokenizer_config_is_refused(tmp_path):
    folder = copy_folder(tmp_path)
    (folder / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not valid JSON"):
        Tokenizer.from_folder(folder)


def test_special_token_outside_vocabulary_is_refused(tmp_path):
    with pytest.raises(TokenizerError, match="eos_token '<eos>' is not in the vocabulary"):
        Tokenizer.from_folder(copy_folder(tmp_path, eos_token="<eos>"))


def test_eos_id_outside_vocabulary_is_refused(tmp_path):
    folder = copy_folder(tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 99999}))
    with pytest.raises(TokenizerError, match="eos_token_id 99999"):
        Tokenizer.from_folder(folder)


def test_chat_template_syntax_error_is_refused(tmp_path):
    with pytest.raises(TokenizerError, match="does not compile"):
        Tokenizer.from_folder(copy_folder(tmp_path, chat_template="{% for m in messages %}"))
