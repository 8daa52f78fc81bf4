"""The playground streams an adapter's answer and the base model's side by side, through
`POST /v1/chat/completions` with the signed-in session and the CSRF token.

Needs a real engine: the serving layer's `live_engine_server` fixture (a `manage.py serve`
process with the tiny model and a ready adapter `pirate` for tenant `serve-a`).
"""

import pytest

from tenants.scopes import MEMBER
from tests.browser.conftest import sign_in

PLAYER = ("player@example.com", "player-password-1")
# Committed rows (the server is another process); the flush afterwards removes the player.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def engine_server(live_engine_server):
    return live_engine_server


@pytest.fixture
def player(engine_server, transactional_db):
    """A member (not an admin: the playground is for every member) of the server's tenant."""
    from django.contrib.auth.hashers import make_password

    from tenants.models import Tenant
    from tenants.services import membership_set, user_get_or_create

    user = user_get_or_create(email=PLAYER[0])
    user.password = make_password(PLAYER[1], hasher="pbkdf2_sha256")  # what `serve` checks
    user.save()
    membership_set(tenant=Tenant.objects.get(slug="serve-a"), user=user, role=MEMBER)
    return user


def test_the_playground_streams_the_adapter_and_the_base_side_by_side(
    page, engine_server, player, screenshot
):
    sign_in(page, engine_server.url, *PLAYER)
    page.goto(f"{engine_server.url}/playground/?model=pirate")
    assert page.input_value("#model") == "pirate"
    assert page.locator("#pane-base").is_visible()

    main = page.locator("#pane-main .turn.assistant")
    page.evaluate(
        """() => {
          window.lengthsSeen = new Set();
          new MutationObserver(() => {
            const turn = document.querySelector("#pane-main .turn.assistant");
            if (turn) window.lengthsSeen.add(turn.textContent.length);
          }).observe(document.getElementById("pane-main"),
                     {subtree: true, childList: true, characterData: true});
        }"""
    )
    page.fill("#message", "Tell me about the sea.")
    page.fill("#max-tokens", "48")
    page.click("#send")

    page.wait_for_selector("#pane-main .turn.assistant[data-done]", timeout=120_000)
    page.wait_for_selector("#pane-base .turn.assistant[data-done]", timeout=120_000)
    screenshot("playground")
    assert main.get_attribute("data-done") == "true", main.inner_text()
    base = page.locator("#pane-base .turn.assistant")
    assert base.get_attribute("data-done") == "true", base.inner_text()
    adapter_reply, base_reply = main.inner_text(), base.inner_text()
    assert adapter_reply and base_reply
    assert adapter_reply != base_reply  # the adapter changes the model's answer
    assert page.evaluate("window.lengthsSeen.size") >= 3  # it streamed in, not all at once
