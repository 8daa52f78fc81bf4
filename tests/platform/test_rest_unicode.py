"""A lone surrogate in a REST body is the caller's 400 naming the field, and nothing is kept.

JSON can spell `"\\ud800"`; Python parses it into a string that PostgreSQL's driver cannot
encode, so without the parser's check a key name or an adapter description holding one
failed at the database write.
"""

import json

import pytest

from registry.models import Adapter
from tenants.models import ApiKey
from tests.registry.conftest import (  # noqa: F401 (fixtures)
    adapter,
    base_model,
    good_adapter_dir,
    registry_settings,
    tiny_base_dir,
)

pytestmark = pytest.mark.django_db

LONE = "\ud800"


@pytest.mark.parametrize(
    ("method", "path", "body", "param"),
    [
        ("post", "/api/v1/keys/", {"name": f"ci{LONE}", "scopes": ["inference"]}, "name"),
        ("post", "/api/v1/keys/", {"name": "ci", "scopes": ["inference", LONE]}, "scopes[1]"),
        ("post", "/api/v1/adapters/", {"name": "bot", "description": f"a {LONE} b"}, "description"),
        ("patch", "/api/v1/adapters/support-bot/", {"description": LONE}, "description"),
        ("post", "/api/v1/adapters/", {"name": "bot", f"k{LONE}": 1}, "k\\ud800"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field_and_nothing_is_kept(
    tenant_a,
    make_key,
    key_client,
    adapter,  # noqa: F811
    method,
    path,
    body,
    param,
):
    _, key = make_key(tenant_a)
    keys_before = ApiKey.objects.count()
    adapters_before = list(Adapter.objects.values_list("name", "description"))
    raw = json.dumps(body)  # ASCII JSON: the surrogate travels as the \ud800 escape
    assert "\\ud800" in raw
    response = getattr(key_client(key), method)(path, raw, content_type="application/json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["param"] == param
    assert "unpaired UTF-16 surrogate (U+D800)" in error["message"]
    assert ApiKey.objects.count() == keys_before
    assert list(Adapter.objects.values_list("name", "description")) == adapters_before


def test_a_surrogate_pair_is_text_and_is_kept(tenant_a, make_key, key_client, adapter):  # noqa: F811
    _, key = make_key(tenant_a)
    raw = json.dumps({"description": "smile \ud83d\ude00"})  # one character, escaped as a pair
    response = key_client(key).patch(
        "/api/v1/adapters/support-bot/", raw, content_type="application/json"
    )
    assert response.status_code == 200, response.content
    assert Adapter.objects.get(name="support-bot").description == "smile \U0001f600"
