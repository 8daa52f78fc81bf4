"""API keys and usage in the browser: a key is shown once with a copy button and revoked
after a confirmation; the usage chart is drawn from the tenant's metered requests."""

from tenants.keys import key_matches
from tenants.models import ApiKey
from tests.browser.conftest import sign_in
from tests.usage_records import usage_record

ALICE = ("alice@example.com", "alice-password-1")


def test_a_key_is_shown_once_copied_and_revoked_after_confirmation(
    page, live_server, tenant_a, screenshot
):
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    sign_in(page, live_server.url, *ALICE)
    page.click("text=API keys")
    page.fill("#create-key input[name=name]", "ci")
    page.check("#create-key input[value='registry:read']")
    page.click("#create-key button[type=submit]")

    full = page.input_value("#new-key-value")
    key = ApiKey.objects.get(name="ci")
    assert key_matches(full, key.hashed_key)
    assert key.scopes == ["inference", "registry:read"]
    page.click("#copy-key")
    assert page.evaluate("navigator.clipboard.readText()") == full
    screenshot("key-created")

    page.goto(f"{live_server.url}/keys/")
    assert full not in page.content()  # once means once
    row = page.locator(f'tr[data-key="{key.prefix}"]')
    assert "active" in row.inner_text()

    page.once("dialog", lambda dialog: dialog.dismiss())  # changing one's mind keeps the key
    row.locator("text=Revoke").click()
    assert ApiKey.objects.get(pk=key.pk).revoked_at is None

    page.once("dialog", lambda dialog: dialog.accept())
    row.locator("text=Revoke").click()
    page.wait_for_selector(".messages")
    assert "revoked" in page.locator(f'tr[data-key="{key.prefix}"]').inner_text()
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None
    screenshot("keys")


def test_the_usage_page_draws_tokens_per_day_per_adapter(page, live_server, tenant_a, screenshot):
    for days_ago, model, tokens in [
        (0, "support-bot", 900),
        (1, "support-bot", 400),
        (1, "faq-bot", 250),
        (3, "tiny-llama", 120),
    ]:
        usage_record(tenant_a, model, tokens, tokens // 3, days_ago=days_ago)
    sign_in(page, live_server.url, *ALICE)
    page.click("text=Usage")
    # The selector shows the period the chart draws, chosen or not.
    assert page.input_value("select[name=days]") == "30"
    assert "last 30 days" in page.locator("h2").first.inner_text()
    page.select_option("select[name=days]", "7")
    page.click("#period button")
    page.wait_for_url("**/usage/?days=7")
    assert page.input_value("select[name=days]") == "7"
    assert "last 7 days" in page.locator("h2").first.inner_text()

    assert page.locator("#usage-chart rect").count() == 4
    assert page.locator(".legend li").all_inner_texts() == ["faq-bot", "support-bot", "tiny-llama"]
    assert page.locator("#usage-table tbody tr").count() == 4
    screenshot("usage")
