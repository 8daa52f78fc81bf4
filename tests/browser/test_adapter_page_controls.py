"""An adapter's page in the browser: the controls offer only what the server accepts (Promote
and Canary disabled while a version is being evaluated, no Canary on the version production
serves), and the server still refuses a control forced back on; the eval set is attached and
replaced from the page; the audit trail's dates stay on one line."""

import io

from registry.models import Alias
from registry.services.eval_sets import eval_set_attach
from tests.browser.conftest import sign_in
from tests.registry.conftest import ALICE_ACTOR, second_adapter_dir  # noqa: F401  (fixture)
from tests.ui.conftest import make_version

ALICE = ("alice@example.com", "alice-password-1")
TWO_ROWS = b'{"prompt": "2 + 2 =", "completion": " 4"}\n{"prompt": "Hi", "completion": " there"}\n'
THREE_ROWS = TWO_ROWS + b'{"prompt": "Sky:", "completion": " blue"}\n'


def open_adapter(page, live_server, name="support-bot"):
    sign_in(page, live_server.url, *ALICE)
    page.goto(f"{live_server.url}/adapters/{name}/")


def test_promote_and_canary_are_disabled_while_a_version_is_evaluated(
    page, live_server, adapter, good_adapter_dir, screenshot
):
    # An eval set and no engine to score it: the version stays pending, being evaluated.
    eval_set_attach(adapter=adapter, file=io.BytesIO(TWO_ROWS), actor=ALICE_ACTOR)
    make_version(adapter, good_adapter_dir)
    open_adapter(page, live_server)

    promote = page.locator('button[data-promote="1"]')
    assert promote.is_disabled() and page.locator('button[data-canary="1"]').is_disabled()
    assert "evaluation pending" in promote.get_attribute("title")
    assert "has not passed its evaluation" in page.locator('[data-refusal="1"]').inner_text()
    screenshot("promote-disabled-while-evaluating")

    # Forced back on (a stale page, a hand-made request): the server refuses it all the same.
    promote.evaluate("button => { button.disabled = false; }")
    promote.click()
    page.wait_for_selector(".messages")
    assert "v1 has not passed its evaluation" in page.locator(".messages").inner_text()
    assert not Alias.objects.exists()


def test_no_canary_is_offered_on_the_version_production_serves(
    page,
    live_server,
    adapter,
    good_adapter_dir,
    second_adapter_dir,  # noqa: F811
):
    make_version(adapter, good_adapter_dir)
    make_version(adapter, second_adapter_dir)
    open_adapter(page, live_server)
    page.click('button[data-promote="1"]')
    page.wait_for_selector('tr[data-alias="production"]')

    assert page.locator('button[data-canary="1"]').count() == 0
    assert page.locator('button[data-canary="2"]').is_enabled()
    page.click('button[data-canary="2"]')
    page.wait_for_selector('tr[data-alias="canary"]')
    assert page.locator('tr[data-alias="canary"] .alias-version').inner_text() == "v2"


def test_the_eval_set_is_attached_and_replaced_from_the_page(
    page, live_server, adapter, tmp_path, screenshot
):
    open_adapter(page, live_server)
    assert "No eval set" in page.locator("#eval-set-current").inner_text()
    rows = tmp_path / "eval.jsonl"
    rows.write_bytes(TWO_ROWS)
    page.set_input_files("#eval-set-file", str(rows))
    page.click("#eval-set-button")
    page.wait_for_selector("#eval-set-current:has-text('2 rows')")
    assert page.locator("#eval-set-button").inner_text() == "Replace"

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"prompt": "no completion"}\n')
    page.set_input_files("#eval-set-file", str(bad))
    page.click("#eval-set-button")
    error = page.locator("#eval-set-error")
    error.wait_for()
    assert error.inner_text().startswith("Eval set refused: ") and "line 1" in error.inner_text()
    assert "2 rows" in page.locator("#eval-set-current").inner_text()  # nothing stored

    rows.write_bytes(THREE_ROWS)
    page.set_input_files("#eval-set-file", str(rows))
    page.click("#eval-set-button")
    page.wait_for_selector("#eval-set-current:has-text('3 rows')")
    assert page.locator("#audit tr:has-text('eval_set.attach')").count() == 2
    assert adapter.eval_sets.get(is_current=True).rows == 3
    screenshot("eval-set")


def test_the_audit_trails_dates_stay_on_one_line(page, live_server, adapter, good_adapter_dir):
    make_version(adapter, good_adapter_dir)
    page.set_viewport_size({"width": 900, "height": 900})  # a narrow window squeezes columns
    open_adapter(page, live_server)
    dates = page.locator("#audit time")
    assert dates.count() >= 1
    lines = dates.evaluate_all("times => times.map(t => t.getClientRects().length)")
    assert set(lines) == {1}, lines
