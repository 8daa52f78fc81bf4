"""An adapter's life in the browser: sign in, create, upload with a live progress bar, watch
validation by a real worker reach `ready`, promote it; and a broken upload's failed checks."""

import pytest

from registry.models import AdapterVersion, Alias
from tests.browser.conftest import sign_in
from tests.peft_adapters import make_peft_adapter
from tests.registry.conftest import BASE_NAME

ALICE = ("alice@example.com", "alice-password-1")
ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Slow enough that the bar visibly moves through the middle; the upload still takes seconds.
UPLOAD_BYTES_PER_SECOND = 256 * 1024


@pytest.fixture(scope="module")
def large_adapter_dir(tiny_base_dir, tmp_path_factory):
    """Rank 64 on every projection: about a megabyte, so the upload has a middle to show."""
    return make_peft_adapter(
        tiny_base_dir,
        tmp_path_factory.mktemp("large"),
        rank=64,
        alpha=64,
        targets=ALL_PROJECTIONS,
        base_model_name=BASE_NAME,
    )


def throttle_uploads(page, bytes_per_second: int):
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send(
        "Network.emulateNetworkConditions",
        {
            "offline": False,
            "latency": 0,
            "downloadThroughput": -1,
            "uploadThroughput": bytes_per_second,
        },
    )
    return cdp


def record_progress(page):
    """Keep every value the progress bar takes (a MutationObserver on its value)."""
    page.evaluate(
        """() => {
          window.progressSeen = [];
          const bar = document.getElementById("upload-progress");
          new MutationObserver(() => window.progressSeen.push(Number(bar.value)))
            .observe(bar, {attributes: true, attributeFilter: ["value"]});
        }"""
    )


def test_signing_in_shows_the_tenants_adapters(page, live_server, tenant_a, screenshot):
    page.goto(f"{live_server.url}/adapters/")
    page.wait_for_url("**/login/?next=/adapters/")
    screenshot("login")
    page.fill("input[name=username]", ALICE[0])
    page.fill("input[name=password]", "wrong")
    page.click("button[type=submit]")
    assert page.locator("[role=alert]").inner_text().startswith("Your email and password")

    sign_in(page, live_server.url, *ALICE)
    assert page.locator(".tenant-name").inner_text() == "Tenant A"
    assert page.locator(".role").inner_text() == "owner"


def test_an_upload_shows_progress_turns_ready_and_is_promoted(
    page, live_server, base_model, tenant_a, live_worker, large_adapter_dir, screenshot
):
    sign_in(page, live_server.url, *ALICE)
    page.fill("#new-adapter input[name=name]", "support-bot")
    page.fill("#new-adapter input[name=description]", "ticket replies")
    page.click("#new-adapter button[type=submit]")
    page.wait_for_url("**/adapters/support-bot/upload/")

    page.set_input_files("#config-file", str(large_adapter_dir / "adapter_config.json"))
    page.set_input_files("#weights-file", str(large_adapter_dir / "adapter_model.safetensors"))
    record_progress(page)
    cdp = throttle_uploads(page, UPLOAD_BYTES_PER_SECOND)
    page.click("#upload-button")

    page.wait_for_function(
        "() => { const v = document.getElementById('upload-progress').value;"
        " return v >= 20 && v < 90; }"
    )
    screenshot("upload-in-progress")
    assert page.locator("#upload-button").is_disabled()

    status = page.locator(".version-status")
    status.wait_for()
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )
    page.wait_for_selector('.version-status[data-status="ready"]', timeout=60_000)
    screenshot("upload-ready")

    seen = page.evaluate("window.progressSeen")
    assert seen == sorted(seen) and seen[-1] == 100
    assert len([v for v in seen if 0 < v < 100]) >= 3, seen  # real progress events, not a jump
    assert "v1" in status.inner_text()

    page.click("text=Open support-bot")
    page.click('button[data-promote="1"]')
    page.wait_for_selector('tr[data-alias="production"]')
    assert page.locator('tr[data-alias="production"] .alias-version').inner_text() == "v1"
    assert "support-bot@production now serves v1" in page.locator(".messages").inner_text()
    screenshot("adapter-page")

    alias = Alias.objects.get(adapter__name="support-bot", name="production")
    assert alias.version.number == 1 and alias.version.status == AdapterVersion.READY
    assert alias.updated_by == "user:alice@example.com"


def test_a_broken_upload_shows_the_failed_checks(
    page, live_server, adapter, live_worker, good_adapter_dir, tmp_path, screenshot
):
    broken = tmp_path / "adapter_model.safetensors"
    broken.write_bytes(bytes(range(7, 256)) * 40)  # some other file, picked as the weights
    sign_in(page, live_server.url, *ALICE)
    page.goto(f"{live_server.url}/adapters/support-bot/upload/")
    page.set_input_files("#config-file", str(good_adapter_dir / "adapter_config.json"))
    page.set_input_files("#weights-file", str(broken))
    page.click("#upload-button")

    page.wait_for_selector('.version-status[data-status="rejected"]', timeout=60_000)
    failed = page.locator(".failed-checks li").all_inner_texts()
    version = AdapterVersion.objects.get(adapter=adapter)
    expected = [
        f"{c['name']}: {c['message']}"
        for c in version.report
        if not c["passed"] and c["level"] != "warning"
    ]
    assert failed == expected and failed
    # What it is not, not what its first bytes would mean as a header length.
    assert failed[0].startswith("safetensors: adapter_model.safetensors: not a safetensors file")
    assert "above the limit" not in failed[0]
    screenshot("upload-rejected")


def test_an_upload_without_both_files_is_refused_before_sending(
    page, live_server, adapter, good_adapter_dir
):
    sign_in(page, live_server.url, *ALICE)
    page.goto(f"{live_server.url}/adapters/support-bot/upload/")
    page.set_input_files("#config-file", str(good_adapter_dir / "adapter_config.json"))
    page.click("#upload-button")
    assert "Pick both files" in page.locator("#upload-error").inner_text()
    assert not AdapterVersion.objects.exists()
