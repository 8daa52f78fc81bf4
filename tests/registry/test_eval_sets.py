"""Eval sets: what a valid one is (registry/eval_sets.py), storing and replacing them, the
generic set per base model, reading rows back, and the operators' command.

Every bad set is refused with the line and field named, and leaves nothing: no row, no
object in storage, no audit event.
"""

import hashlib
import io
import json
import re

import pytest
from django.core.files.storage import storages
from django.core.management import CommandError, call_command
from django.db.models import ProtectedError

from audit.models import AuditEvent
from registry import objectstore
from registry.errors import InvalidEvalSet, StorageUnavailable, UploadTooLarge
from registry.eval_sets import MAX_ROW_CHARS, parse_eval_set
from registry.models import EvalSet
from registry.selectors import eval_set_for
from registry.services.adapters import adapter_create
from registry.services.eval_sets import eval_set_attach, eval_set_attach_default
from registry.services.evaluations import eval_set_rows
from registry.staging import StagingError
from tests.registry.conftest import ALICE_ACTOR, BASE_NAME, make_ready_version, stored_objects

pytestmark = pytest.mark.django_db

CHAT_ROW = {
    "messages": [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
    ],
    "completion": "Bonjour",
}
PROMPT_ROW = {"prompt": "2 + 2 =", "completion": " 4"}


def jsonl(*rows) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def attach(adapter, data: bytes, **kwargs):
    return eval_set_attach(adapter=adapter, file=io.BytesIO(data), actor=ALICE_ACTOR, **kwargs)


def assert_nothing_stored(adapter):
    assert not EvalSet.objects.exists()
    assert stored_objects() == []
    assert not AuditEvent.objects.filter(tenant=adapter.tenant, verb="eval_set.attach").exists()


# ---------------------------------------------------------------- bad eval sets

LONG = "x" * (MAX_ROW_CHARS - 1)
BAD = {
    "not JSONL": (jsonl(PROMPT_ROW) + b"this is not json\n", 2, None, "not valid JSON"),
    "truncated JSON": (b'{"prompt": "a", "completion": ', 1, None, "not valid JSON"),
    "an array line": (jsonl(PROMPT_ROW, [PROMPT_ROW]), 2, None, "must be a JSON object"),
    "a string line": (b'"just text"\n', 1, None, "must be a JSON object"),
    "an unknown field": (
        jsonl({**PROMPT_ROW, "score": 1}),
        1,
        "score",
        "unknown field(s) 'score'",
    ),
    "OpenAI fine-tuning rows": (
        jsonl({"messages": [{"role": "user", "content": "hi"}]}),
        1,
        "completion",
        "missing",
    ),
    "both messages and prompt": (
        jsonl({**PROMPT_ROW, "messages": CHAT_ROW["messages"]}),
        1,
        "messages",
        "both of 'messages' and 'prompt'",
    ),
    "neither messages nor prompt": (
        jsonl({"completion": "x"}),
        1,
        None,
        "neither of 'messages' and 'prompt'",
    ),
    "an empty completion": (jsonl({"prompt": "p", "completion": ""}), 1, "completion", "non-empty"),
    "a blank completion": (
        jsonl({"prompt": "p", "completion": " \n "}),
        1,
        "completion",
        "non-empty",
    ),
    "a completion that is not a string": (
        jsonl({"prompt": "p", "completion": ["a"]}),
        1,
        "completion",
        "non-empty string",
    ),
    "an empty prompt": (jsonl({"prompt": "", "completion": "c"}), 1, "prompt", "non-empty"),
    "a prompt that is a number": (jsonl({"prompt": 3, "completion": "c"}), 1, "prompt", "string"),
    "a bad message role": (
        jsonl({"messages": [{"role": "robot", "content": "hi"}], "completion": "c"}),
        1,
        "messages[0].role",
        "must be one of",
    ),
    "messages that are not a list": (
        jsonl({"messages": "hi", "completion": "c"}),
        1,
        "messages",
        "non-empty list",
    ),
    "an empty user message": (
        jsonl({"messages": [{"role": "user", "content": " "}], "completion": "c"}),
        1,
        "messages[0].content",
        "must not be empty",
    ),
    "a message with a tool call": (
        jsonl(
            {"messages": [{"role": "user", "content": "x", "tool_calls": []}], "completion": "c"}
        ),
        1,
        "messages[0]",
        "unsupported field(s): tool_calls",
    ),
    "an image part": (
        jsonl(
            {
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
                "completion": "c",
            }
        ),
        1,
        "messages[0].content",
        "only text is supported",
    ),
    "messages ending with the assistant's": (
        jsonl(
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"},
                ],
                "completion": "c",
            }
        ),
        1,
        "messages[1].role",
        "must not be the assistant's",
    ),
    "too long a prompt row": (
        jsonl(PROMPT_ROW, {"prompt": LONG, "completion": "ab"}),
        2,
        "prompt",
        f"at most {MAX_ROW_CHARS} per row",
    ),
    "too long a chat row": (
        jsonl({"messages": [{"role": "user", "content": LONG}], "completion": "ab"}),
        1,
        "messages",
        f"at most {MAX_ROW_CHARS} per row",
    ),
    "not UTF-8": (
        jsonl(PROMPT_ROW) + '{"prompt": "café", "completion": "x"}\n'.encode("latin-1"),
        2,
        None,
        "not UTF-8 (byte 0xe9 at column 16)",
    ),
    "UTF-16": ('{"prompt": "a", "completion": "b"}'.encode("utf-16"), 1, None, "not UTF-8"),
    "a duplicated field": (
        b'{"prompt": "a", "completion": "b", "completion": "c"}\n',
        1,
        "completion",
        "appears twice",
    ),
    "an unpaired surrogate": (
        b'{"prompt": "a\\ud800", "completion": "b"}\n',
        1,
        "prompt",
        "unpaired surrogate",
    ),
    "nesting too deep": (
        b'{"prompt": ' + b"[" * 200_000 + b"]" * 200_000 + b', "completion": "b"}',
        1,
        None,
        "nested too deeply",
    ),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_a_bad_eval_set_names_the_line_and_field_and_stores_nothing(case, adapter, settings):
    settings.EVAL_MAX_BYTES = 2 * 1024 * 1024  # "nesting too deep" is 400 kB
    data, line, field, words = BAD[case]
    with pytest.raises(InvalidEvalSet) as refused:
        attach(adapter, data)
    error = refused.value
    assert (error.status, error.param, error.line, error.field) == (400, "file", line, field)
    where = f"line {line}" if field is None else f"line {line}, {field}"
    assert error.message.startswith(f"{where}: "), error.message
    assert words in error.message, error.message
    assert_nothing_stored(adapter)


@pytest.mark.parametrize("data", [b"", b"\n  \n\r\n"], ids=["empty", "blank lines"])
def test_an_eval_set_without_rows_is_refused(data, adapter):
    with pytest.raises(InvalidEvalSet, match="no rows"):
        attach(adapter, data)
    assert_nothing_stored(adapter)


def test_more_rows_than_the_limit_names_the_first_row_too_many(adapter, settings):
    settings.EVAL_MAX_ROWS = 3
    data = jsonl(PROMPT_ROW, PROMPT_ROW) + b"\n" + jsonl(PROMPT_ROW, PROMPT_ROW)
    with pytest.raises(InvalidEvalSet) as refused:
        attach(adapter, data)
    assert refused.value.line == 5  # the blank line 3 is not a row, but it is a line
    assert "more than 3 rows" in refused.value.message
    assert "LORAPLEX_EVAL_MAX_ROWS" in refused.value.message
    assert_nothing_stored(adapter)
    assert attach(adapter, jsonl(PROMPT_ROW) * 3)[0].rows == 3  # the limit itself is fine


def test_more_bytes_than_the_limit_is_413_naming_the_line(adapter, settings):
    settings.EVAL_MAX_BYTES = 100
    row = jsonl(PROMPT_ROW)
    assert 2 * len(row) <= 100 < 3 * len(row)
    with pytest.raises(UploadTooLarge) as refused:
        attach(adapter, row * 3)
    assert refused.value.status == 413 and refused.value.param == "file"
    assert refused.value.message.startswith("line 3: ")
    assert "LORAPLEX_EVAL_MAX_BYTES" in refused.value.message
    assert_nothing_stored(adapter)
    assert attach(adapter, row * 2)[0].size == 2 * len(row)


# ---------------------------------------------------------------- the parser alone


def test_rows_parse_as_the_chat_api_takes_messages():
    data = "\ufeff".encode() + jsonl(CHAT_ROW).replace(b"\n", b"\r\n") + b"\n" + jsonl(PROMPT_ROW)
    chat, plain = parse_eval_set(data, max_rows=10, max_bytes=len(data))
    assert chat.line == 1 and plain.line == 3
    assert chat.messages == (
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello"},
    )
    assert chat.prompt is None and chat.completion == "Bonjour"
    assert plain.to_dict() == PROMPT_ROW and plain.messages is None
    assert chat.to_dict()["messages"][0] == {"role": "system", "content": "Answer in French."}


def test_the_row_limit_counts_completion_and_every_message():
    half = "y" * (MAX_ROW_CHARS // 2)
    row = {
        "messages": [{"role": "system", "content": half}, {"role": "user", "content": half}],
        "completion": "z",
    }
    with pytest.raises(InvalidEvalSet, match=f"{MAX_ROW_CHARS + 1} characters"):
        parse_eval_set(jsonl(row), max_rows=1, max_bytes=10**6)
    row["messages"] = [{"role": "system", "content": half[:-1]}, {"role": "user", "content": half}]
    assert parse_eval_set(jsonl(row), max_rows=1, max_bytes=10**6)[0].completion == "z"


def test_the_param_names_the_part_the_set_came_in():
    with pytest.raises(InvalidEvalSet) as refused:
        parse_eval_set(b"[]", max_rows=1, max_bytes=10, param="eval")
    assert refused.value.param == "eval"


# ---------------------------------------------------------------- storing and replacing


def test_a_good_eval_set_round_trips(adapter):
    data = jsonl(CHAT_ROW, PROMPT_ROW)
    eval_set, created = attach(adapter, data)
    assert created and eval_set.is_current and not eval_set.is_generic
    assert eval_set.adapter == adapter and eval_set.base_model is None
    assert eval_set.sha256 == hashlib.sha256(data).hexdigest()
    assert (eval_set.size, eval_set.rows, eval_set.created_by) == (len(data), 2, ALICE_ACTOR)
    prefix = f"adapters/{adapter.tenant_id}/{adapter.pk}/eval-sets/{eval_set.uid.hex}/"
    assert eval_set.key.startswith(prefix)
    assert stored_objects() == [eval_set.key]
    with storages["default"].open(eval_set.key, "rb") as f:
        assert f.read() == data
    rows = eval_set_rows(eval_set)
    assert [r.to_dict() for r in rows] == [
        {
            "messages": [
                {"role": "system", "content": "Answer in French."},
                {"role": "user", "content": "Hello"},
            ],
            "completion": "Bonjour",
        },
        PROMPT_ROW,
    ]
    event = AuditEvent.objects.get(verb="eval_set.attach")
    assert (event.tenant, event.actor, event.object_type, event.object_repr) == (
        adapter.tenant,
        ALICE_ACTOR,
        "adapter",
        "support-bot",
    )
    assert event.before is None
    assert event.after == {"sha256": eval_set.sha256, "rows": 2, "size": len(data)}


def test_replacing_makes_the_new_set_current_and_drops_the_old_one(
    adapter, django_capture_on_commit_callbacks
):
    first, _ = attach(adapter, jsonl(PROMPT_ROW))
    with django_capture_on_commit_callbacks(execute=True):
        second, created = attach(adapter, jsonl(CHAT_ROW))
    assert created and second.is_current
    assert list(EvalSet.objects.all()) == [second]  # nothing refers to the old one
    assert stored_objects() == [second.key]
    assert eval_set_for(adapter) == second
    events = AuditEvent.objects.filter(verb="eval_set.attach").order_by("id")
    assert [e.after["sha256"] for e in events] == [first.sha256, second.sha256]
    assert events.last().before == {"sha256": first.sha256, "rows": 1, "size": first.size}


def test_the_same_bytes_again_change_nothing(adapter):
    data = jsonl(PROMPT_ROW)
    first, _ = attach(adapter, data)
    objects, events = stored_objects(), AuditEvent.objects.count()
    again, created = attach(adapter, data)
    assert again == first and not created
    assert stored_objects() == objects and AuditEvent.objects.count() == events


def test_a_superseded_set_something_refers_to_stays_with_its_bytes(
    adapter, monkeypatch, django_capture_on_commit_callbacks
):
    """The coming evaluations point at the set they used (PROTECT): pruning skips those."""
    first, _ = attach(adapter, jsonl(PROMPT_ROW))

    def protected(self, *args, **kwargs):
        raise ProtectedError("an evaluation refers to it", {self})

    monkeypatch.setattr(EvalSet, "delete", protected)
    with django_capture_on_commit_callbacks(execute=True):
        second, _ = attach(adapter, jsonl(CHAT_ROW))
    first.refresh_from_db()
    assert not first.is_current and second.is_current
    assert sorted(stored_objects()) == sorted([first.key, second.key])
    assert [r.to_dict() for r in eval_set_rows(first)] == [PROMPT_ROW]


def test_a_storage_failure_stores_nothing(adapter, monkeypatch):
    def failing_save(key, f):
        raise StorageUnavailable("object storage failed to write eval_set.jsonl (OSError)")

    monkeypatch.setattr(objectstore, "save", failing_save)
    with pytest.raises(StorageUnavailable):
        attach(adapter, jsonl(PROMPT_ROW))
    assert_nothing_stored(adapter)


def test_a_failure_after_the_object_is_written_deletes_it_again(adapter, monkeypatch):
    import registry.services.eval_sets as service

    def failing_audit(**kwargs):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(service, "audit_record", failing_audit)
    with pytest.raises(RuntimeError):
        attach(adapter, jsonl(PROMPT_ROW))
    assert_nothing_stored(adapter)


def test_changed_stored_bytes_are_refused_when_read(adapter):
    eval_set, _ = attach(adapter, jsonl(PROMPT_ROW))
    path = storages["default"].path(eval_set.key)
    with open(path, "r+b") as f:
        f.write(b"[")
    with pytest.raises(StagingError, match="not the one attached"):
        eval_set_rows(eval_set)
    with open(path, "ab") as f:
        f.write(b"more")
    with pytest.raises(StagingError):
        eval_set_rows(eval_set)


def test_stored_sets_still_read_after_the_limits_are_lowered(adapter, settings):
    eval_set, _ = attach(adapter, jsonl(PROMPT_ROW) * 5)
    settings.EVAL_MAX_ROWS, settings.EVAL_MAX_BYTES = 1, 10
    assert len(eval_set_rows(eval_set)) == 5


# ---------------------------------------------------------------- the generic set


def test_the_generic_set_is_used_for_adapters_without_their_own(
    adapter, base_model, tenant_a, good_adapter_dir
):
    other = adapter_create(tenant=tenant_a, name="other-bot", actor=ALICE_ACTOR)
    version = make_ready_version(adapter, good_adapter_dir)
    assert eval_set_for(adapter) is None and eval_set_for(version) is None
    generic, created = eval_set_attach_default(
        base_model=base_model, file=io.BytesIO(jsonl(PROMPT_ROW)), actor="system:operator"
    )
    assert created and generic.is_generic and generic.base_model == base_model
    assert generic.key.startswith(f"base-models/{base_model.pk}/eval-sets/")
    assert eval_set_for(adapter) == eval_set_for(version) == eval_set_for(other) == generic
    own, _ = attach(adapter, jsonl(CHAT_ROW))
    assert eval_set_for(adapter) == eval_set_for(version) == own
    assert eval_set_for(other) == generic
    # The operator's set is no tenant's: no tenant's audit trail records it.
    assert AuditEvent.objects.filter(verb="eval_set.attach").count() == 1


def test_the_command_sets_and_replaces_the_generic_set(base_model, tmp_path, capsys):
    path = tmp_path / "generic.jsonl"
    path.write_bytes(jsonl(PROMPT_ROW, CHAT_ROW))
    call_command("set_default_eval_set", BASE_NAME, str(path))
    out = capsys.readouterr().out
    assert f"{BASE_NAME}: generic eval set of 2 rows" in out and "now current" in out
    first = EvalSet.objects.get(base_model=base_model, is_current=True)
    assert first.created_by == "system:operator"
    call_command("set_default_eval_set", BASE_NAME, str(path))
    assert "unchanged" in capsys.readouterr().out
    path.write_bytes(jsonl(PROMPT_ROW))
    call_command("set_default_eval_set", BASE_NAME, str(path))
    current = EvalSet.objects.get(base_model=base_model, is_current=True)
    assert current != first and current.rows == 1


@pytest.mark.parametrize(
    "name, content, words",
    [
        (BASE_NAME, b'{"prompt": "p"}\n', "line 1, completion: missing"),
        ("no-such-model", b"", "no base model named 'no-such-model'; known: tiny-llama"),
        (BASE_NAME, None, "cannot read"),
    ],
    ids=["bad set", "unknown base model", "missing file"],
)
def test_the_command_refuses_with_a_reason(name, content, words, base_model, tmp_path):
    path = tmp_path / "set.jsonl"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CommandError, match=re.escape(words)):
        call_command("set_default_eval_set", name, str(path))
    assert not EvalSet.objects.exists() and stored_objects() == []


def test_the_admin_lists_eval_sets_read_only(client, django_user_model, adapter, base_model):
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(admin)
    own, _ = attach(adapter, jsonl(PROMPT_ROW))
    eval_set_attach_default(
        base_model=base_model, file=io.BytesIO(jsonl(CHAT_ROW)), actor="system:operator"
    )
    page = client.get("/admin/registry/evalset/").content.decode()
    assert "tenant-a/support-bot" in page and own.sha256[:12] in page and BASE_NAME in page
    assert client.get(f"/admin/registry/evalset/{own.pk}/change/").status_code == 200
    assert client.get("/admin/registry/evalset/?is_current__exact=1&q=support").status_code == 200
    assert client.get("/admin/registry/evalset/add/").status_code == 403
    assert client.get(f"/admin/registry/evalset/{own.pk}/delete/").status_code == 403
