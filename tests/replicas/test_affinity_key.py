"""The affinity key the shipped docker/haproxy.cfg hashes, read back from HAProxy itself: the
frontend's rules run as shipped, and a rule added after them answers each request with the key
instead of passing it on. No replica, no database."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.waiting import wait_for

from .router import Router

PREFIX = "0123456789ab"
KEY = f"lpx_{PREFIX}_Se_cr-et0123456789abcdefghijklmnopqrstuvwxyzABCD"
ECHO = (
    '    http-request return status 200 content-type text/plain lf-string "%[var(txn.affinity)]"\n'
)


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    router = Router(tmp_path_factory.mktemp("affinity-key"), {})
    shipped = router.config.read_text()
    assert shipped.count("\n    use_backend ") == 1
    router.config.write_text(shipped.replace("    use_backend ", ECHO + "    use_backend ", 1))
    router.start()
    wait_for(lambda: _listening(router), what="haproxy listening")
    yield router
    router.stop()


def _listening(router: Router) -> bool:
    try:
        return router.get("/v1/models").status_code == 200
    except httpx.TransportError:
        return False


def key_of(router: Router, model: object = None, path="/v1/chat/completions", **headers) -> str:
    body = {} if model is None else {"model": model, "messages": []}
    answer = httpx.post(router.url + path, content=json.dumps(body), headers=headers, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.text


def test_an_api_key_counts_by_its_public_prefix_never_its_secret(router):
    key = key_of(router, "support-bot", Authorization=f"Bearer {KEY}")
    assert key == f"{PREFIX}/support-bot"
    assert key_of(router, "support-bot", Authorization=f"bearer  {KEY}") == key  # as Django reads


def test_two_keys_give_the_same_model_name_two_keys(router):
    other = KEY.replace(PREFIX, "ba9876543210")
    assert key_of(router, "support-bot", Authorization=f"Bearer {other}") == (
        "ba9876543210/support-bot"
    )


@pytest.mark.parametrize("model", ["support-bot@production", "support-bot:3", "support-bot"])
def test_every_name_of_one_adapter_has_one_key(router, model):
    """An alias or a version number goes where the adapter is, and where its promotions are
    prefetched."""
    assert key_of(router, model, Authorization=f"Bearer {KEY}") == f"{PREFIX}/support-bot"


def test_a_signed_in_session_counts_by_the_tenant_it_names(router):
    assert key_of(router, "support-bot", **{"X-Loraplex-Tenant": "acme"}) == "acme/support-bot"
    with_key = key_of(
        router, "support-bot", Authorization=f"Bearer {KEY}", **{"X-Loraplex-Tenant": "acme"}
    )
    assert with_key == f"{PREFIX}/support-bot"  # a key's caller is the key's (as Django reads it)


@pytest.mark.parametrize("authorization", [None, "Bearer sk-not-ours", "Basic dXNlcjpwYXNz"])
def test_without_a_caller_the_adapter_name_alone(router, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    assert key_of(router, "support-bot", **headers) == "support-bot"


def test_no_model_no_key_round_robin(router):
    assert key_of(router, None, Authorization=f"Bearer {KEY}") == ""
    assert key_of(router, None, path="/bases/other/v1/chat/completions") == ""
    assert key_of(router, "b", path="/bases/other/v1/chat/completions") == "b"
