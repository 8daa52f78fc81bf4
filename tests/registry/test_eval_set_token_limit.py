"""LORAPLEX_EVAL_MAX_TOKENS: an eval set's scoring work (rows times their length) is bounded
when it is attached, by the eval-set endpoint and by a version upload's `eval` part alike: a
clear 400 naming the field and the line, nothing stored. The rows and byte limits alone let
a set reach a million tokens of scoring per version."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from registry.eval_sets import parse_eval_set
from registry.models import AdapterVersion, EvalSet
from registry.selectors import eval_set_for
from registry.services.evaluations import eval_set_rows
from tests.registry.conftest import files_of, stored_objects

pytestmark = pytest.mark.django_db

URL = "/api/v1/adapters/support-bot/eval-set/"
VERSIONS = "/api/v1/adapters/support-bot/versions/"


def jsonl(*rows) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def row(prompt_bytes: int, completion: str = "done") -> dict:
    return {"prompt": "x" * prompt_bytes, "completion": completion}


def put(client, data: bytes):
    return client.put(URL, {"file": SimpleUploadedFile("eval.jsonl", data)}, format="multipart")


@pytest.fixture
def alice_client(adapter, alice, user_client):
    return user_client(alice)


def test_the_default_refuses_the_reported_set_that_the_row_and_byte_limits_accept(
    alice_client, adapter, settings
):
    """100 rows of 9,000 bytes: under 200 rows, 1 MiB and 16 KiB a row, over 200,000 tokens."""
    assert (settings.EVAL_MAX_TOKENS, settings.EVAL_MAX_ROWS) == (200_000, 200)
    data = jsonl(*[row(9_000) for _ in range(100)])
    assert len(data) < settings.EVAL_MAX_BYTES
    response = put(alice_client, data)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_eval_set" and error["param"] == "file"
    assert error["message"].startswith("line 23: the rows up to here hold up to 207092 tokens")
    assert "at most 200000 per eval set (LORAPLEX_EVAL_MAX_TOKENS)" in error["message"]
    assert not EvalSet.objects.exists() and stored_objects() == []


def test_a_set_at_the_limit_is_accepted_and_one_byte_more_is_refused(
    alice_client, adapter, settings
):
    settings.EVAL_MAX_TOKENS = 100
    at_limit = [row(46), row(46)]  # 46 + 4 bytes each
    assert put(alice_client, jsonl(*at_limit)).status_code == 201
    kept = eval_set_for(adapter)
    response = put(alice_client, jsonl(row(46), row(47)))
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(
        "line 2: the rows up to here hold up to 101"
    )
    assert eval_set_for(adapter) == kept and len(stored_objects()) == 1


def test_a_version_uploads_eval_part_over_the_limit_refuses_the_upload(
    alice_client, adapter, good_adapter_dir, settings
):
    settings.EVAL_MAX_TOKENS = 10
    body = files_of(good_adapter_dir) | {"eval": SimpleUploadedFile("e.jsonl", jsonl(row(20)))}
    response = alice_client.post(VERSIONS, body, format="multipart")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_eval_set" and error["param"] == "eval"
    assert "LORAPLEX_EVAL_MAX_TOKENS" in error["message"]
    assert not AdapterVersion.objects.exists() and stored_objects() == []


def test_tokens_are_bounded_by_bytes_of_every_message_and_the_completion():
    """UTF-8 bytes, not characters: a tokenizer may make a token of each byte of 'é'."""
    chat = {
        "messages": [
            {"role": "system", "content": "éé"},  # 4 bytes
            {"role": "user", "content": "abc"},  # 3
        ],
        "completion": "é",  # 2
    }
    (parsed,) = parse_eval_set(jsonl(chat), max_rows=1, max_bytes=1000, max_tokens=9)
    assert parsed.token_bound == 9
    with pytest.raises(Exception, match="LORAPLEX_EVAL_MAX_TOKENS") as caught:
        parse_eval_set(jsonl(chat), max_rows=1, max_bytes=1000, max_tokens=8, param="eval")
    assert caught.value.param == "eval" and caught.value.line == 1


def test_a_stored_set_is_read_after_the_limit_is_lowered(alice_client, adapter, settings):
    """Sets already attached keep being measured: the limit applies when one is attached."""
    assert put(alice_client, jsonl(row(500), row(500))).status_code == 201
    settings.EVAL_MAX_TOKENS = 10
    assert len(eval_set_rows(eval_set_for(adapter))) == 2
