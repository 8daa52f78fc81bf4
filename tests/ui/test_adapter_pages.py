"""The adapters list and one adapter's page show what the registry holds, for the right tenant."""

import io
import re

import pytest
from django.test import Client

from audit.models import AuditEvent
from registry.models import Alias
from registry.services.adapters import adapter_create
from registry.services.aliases import alias_set
from registry.services.eval_sets import eval_set_attach
from tests.ui.conftest import ALICE_ACTOR, make_version, page
from tests.ui.forms import press
from tests.usage_records import usage_record

pytestmark = pytest.mark.django_db


def test_anonymous_visitors_are_sent_to_sign_in(client):
    response = client.get("/adapters/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=/adapters/")


def test_signing_in_leads_to_the_adapters(client, alice, tenant_a):
    response = client.post(
        "/login/", {"username": "alice@example.com", "password": "alice-password-1"}, follow=True
    )
    assert response.redirect_chain[-1][0] == "/adapters/"
    assert "Tenant A" in page(response)


def test_a_wrong_password_is_refused_with_a_message(client, alice, tenant_a):
    response = client.post("/login/", {"username": "alice@example.com", "password": "nope"})
    assert response.status_code == 200
    assert "did not match" in page(response)


def test_the_list_shows_latest_version_aliases_and_last_days_requests(
    signed_in, alice, adapter, good_adapter_dir, second_adapter_dir
):
    v1 = make_version(adapter, good_adapter_dir)
    make_version(adapter, second_adapter_dir)
    alias_set(adapter=adapter, name="production", version_number=1, actor=ALICE_ACTOR)
    for _ in range(3):
        usage_record(adapter.tenant, "support-bot", 10, 5, version=v1, hours_ago=1)
    # older than a day: not counted
    usage_record(adapter.tenant, "support-bot", 10, 5, version=v1, hours_ago=30)
    adapter_create(tenant=adapter.tenant, name="empty-one", actor=ALICE_ACTOR)

    html = page(signed_in(alice).get("/adapters/"))

    row = html[html.index('data-adapter="support-bot"') :]
    row = row[: row.index("</tr>")]
    assert "v2" in row and "status-ready" in row
    assert "production → v1" in row
    assert '<td class="num">3</td>' in row
    assert "no version yet" in html[html.index('data-adapter="empty-one"') :]


def test_the_adapter_page_shows_versions_reports_aliases_and_the_audit_trail(
    signed_in, alice, adapter, good_adapter_dir
):
    make_version(adapter, good_adapter_dir)
    rejected = make_version(adapter, good_adapter_dir, weights=b"this is not a safetensors file")
    alias_set(adapter=adapter, name="production", version_number=1, actor=ALICE_ACTOR)

    html = page(signed_in(alice).get("/adapters/support-bot/"))

    assert rejected.status == "rejected"
    assert 'data-version="2"' in html and "status-rejected" in html
    failed = [c for c in rejected.report if not c["passed"]]
    assert failed and all(c["message"] in html for c in failed)
    assert "support-bot@production" in html
    assert "<code>alias.set</code> support-bot@production" in html
    assert "<code>version.upload</code> support-bot/v1" in html
    assert "Upload a new version" in html  # alice is the owner


def test_the_status_partial_polls_until_the_version_is_final(
    signed_in, alice, adapter, good_adapter_dir
):
    from registry.services.versions import adapter_version_create

    with (
        open(good_adapter_dir / "adapter_config.json", "rb") as c,
        open(good_adapter_dir / "adapter_model.safetensors", "rb") as w,
    ):
        version, _ = adapter_version_create(adapter=adapter, config=c, weights=w, actor="t")
    client = signed_in(alice)
    url = "/adapters/support-bot/versions/1/status/"

    pending = page(client.get(url))
    assert 'data-status="pending"' in pending and 'hx-trigger="every 1s"' in pending

    from registry.services.versions import adapter_version_validate

    adapter_version_validate(version_id=version.pk)
    ready = page(client.get(url))
    assert 'data-status="ready"' in ready and "hx-trigger" not in ready


def test_promote_points_production_at_a_ready_version_and_audits_it(
    signed_in, alice, adapter, good_adapter_dir
):
    make_version(adapter, good_adapter_dir)
    response = signed_in(alice).post(
        "/adapters/support-bot/aliases/production/", {"version": 1}, follow=True
    )
    assert "support-bot@production now serves v1" in page(response)
    alias = Alias.objects.get(adapter=adapter, name="production")
    assert alias.version.number == 1 and alias.updated_by == "user:alice@example.com"
    assert AuditEvent.objects.filter(verb="alias.set", actor="user:alice@example.com").exists()


def test_rollback_points_the_alias_back_where_it_was(
    signed_in, alice, adapter, good_adapter_dir, second_adapter_dir
):
    make_version(adapter, good_adapter_dir)
    make_version(adapter, second_adapter_dir)
    client = Client(enforce_csrf_checks=True)  # as a browser: the page's token or nothing
    client.force_login(alice)
    promote = page(client.get("/adapters/support-bot/"))
    press(client, promote, "data-promote", "1")
    press(client, page(client.get("/adapters/support-bot/")), "data-promote", "2")
    assert Alias.objects.get(name="production").version.number == 2

    html = page(client.get("/adapters/support-bot/"))
    assert "Roll back to v1" in html
    response = press(client, html, "data-rollback", "production")

    assert response.status_code == 200
    assert "support-bot@production now serves v1" in page(response)
    assert Alias.objects.get(name="production").version.number == 1
    assert "Roll back to v2" in page(response)  # and the rollback can itself be undone


def test_a_canary_takes_its_weight_and_a_bad_weight_is_explained(
    signed_in, alice, adapter, good_adapter_dir, second_adapter_dir
):
    make_version(adapter, good_adapter_dir)
    make_version(adapter, second_adapter_dir)
    client = signed_in(alice)

    client.post("/adapters/support-bot/aliases/canary/", {"version": 2, "weight": 15})
    assert Alias.objects.get(name="canary").weight == 15

    response = client.post(
        "/adapters/support-bot/aliases/canary/", {"version": 2, "weight": 150}, follow=True
    )
    assert "weight" in page(response) and "less than or equal to 100" in page(response)
    assert Alias.objects.get(name="canary").weight == 15


def test_no_canary_is_offered_on_the_version_production_serves(
    signed_in, alice, adapter, good_adapter_dir, second_adapter_dir
):
    make_version(adapter, good_adapter_dir)
    make_version(adapter, second_adapter_dir)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    press(client, page(client.get("/adapters/support-bot/")), "data-promote", "1")

    html = page(client.get("/adapters/support-bot/"))
    assert 'data-canary="1"' not in html and 'data-canary="2"' in html
    # What a stale page (or a hand-made form) sends: the server refuses it.
    response = signed_in(alice).post(
        "/adapters/support-bot/aliases/canary/", {"version": 1, "weight": 10}, follow=True
    )
    assert (
        "Could not move support-bot@canary: v1 is the version support-bot@production already "
        "serves" in page(response)
    )
    assert not Alias.objects.filter(name="canary").exists()


def test_the_audit_trail_keeps_each_date_on_one_line(signed_in, alice, adapter, good_adapter_dir):
    make_version(adapter, good_adapter_dir)
    html = page(signed_in(alice).get("/adapters/support-bot/"))
    audit = html.split('id="audit"')[1]
    dates = re.findall(r'<td class="([^"]*)" title="[^"]*"><time datetime="[^"]*">([^<]*)<', audit)
    assert dates and all("nowrap" in classes.split() for classes, _ in dates)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", text) for _, text in dates)


def test_the_eval_set_card_shows_the_current_set_and_offers_to_replace_it(
    signed_in, alice, adapter
):
    client = signed_in(alice)
    html = page(client.get("/adapters/support-bot/"))
    assert "No eval set: new versions pass <em>unmeasured</em>" in html
    assert (
        'id="eval-set-form"' in html
        and 'data-api-url="/api/v1/adapters/support-bot/eval-set/"' in html
    )
    eval_set_attach(
        adapter=adapter,
        file=io.BytesIO(b'{"prompt": "Hi", "completion": " there"}\n'),
        actor=ALICE_ACTOR,
    )
    html = page(client.get("/adapters/support-bot/"))
    assert "Its own eval set: <strong>1 rows</strong>" in html and ">Replace</button>" in html
    assert "eval_set.attach" in html.split('id="audit"')[1]


def test_a_member_sees_the_eval_set_but_no_form(signed_in, bob, adapter):
    html = page(signed_in(bob).get("/adapters/support-bot/"))
    assert 'id="eval-set"' in html and 'id="eval-set-form"' not in html


def test_promoting_a_rejected_version_is_refused_with_the_reason(
    signed_in, alice, adapter, good_adapter_dir
):
    make_version(adapter, good_adapter_dir, weights=b"garbage")
    response = signed_in(alice).post(
        "/adapters/support-bot/aliases/production/", {"version": 1}, follow=True
    )
    assert "v1 is rejected" in page(response)
    assert not Alias.objects.exists()


def test_creating_an_adapter_leads_to_its_upload_page(signed_in, alice, tenant_a, base_model):
    response = signed_in(alice).post("/adapters/", {"name": "new-bot", "description": "d"})
    assert response.status_code == 302 and response["Location"] == "/adapters/new-bot/upload/"
    upload = page(signed_in(alice).get("/adapters/new-bot/upload/"))
    assert 'data-api-url="/api/v1/adapters/new-bot/versions/"' in upload


def test_a_bad_adapter_name_is_refused_with_the_rule(signed_in, alice, tenant_a, base_model):
    response = signed_in(alice).post("/adapters/", {"name": "Bad Name!"})
    assert response.status_code == 400
    assert "lowercase letters" in page(response)
    assert 'value="Bad Name!"' in page(response)  # what was typed is kept
