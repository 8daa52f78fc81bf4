"""The operators' admin: every model listed with useful columns, and actions that do what they
say (checked in the database, on disk, or by the calls a recording engine received). Each
action needs its permission: staff who may only view act on nothing, even by a forged POST."""

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from audit.models import AuditEvent
from registry import queue
from registry.models import AdapterVersion, Alias, Evaluation
from registry.services.aliases import alias_set
from tenants.models import ApiKey, Tenant, UsageRecord
from tests.ui.conftest import ALICE_ACTOR, make_version, page
from tests.ui.engine_recorder import start_recorder
from tests.waiting import wait_for


@pytest.fixture
def operator(client, django_user_model):
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(root)
    return client


@pytest.fixture
def engine(settings):
    recorder, server = start_recorder()
    settings.ENGINE_URLS = [recorder.url]
    settings.OPERATOR_TOKEN = "operator-secret"
    settings.METRICS_TOKEN = "metrics-secret"
    yield recorder
    server.shutdown()
    server.server_close()


def act(client, model_path, action, objects):
    return client.post(
        f"/admin/{model_path}/",
        {"action": action, "_selected_action": [o.pk for o in objects]},
        follow=True,
    )


@pytest.mark.django_db
def test_every_model_has_a_working_list_search_and_filters(operator, adapter, good_adapter_dir):
    make_version(adapter, good_adapter_dir)
    UsageRecord.objects.create(tenant=adapter.tenant, model="support-bot", endpoint="chat")
    for url in (
        "/admin/tenants/tenant/?q=tenant&is_active__exact=1",
        "/admin/tenants/membership/?role__exact=member",
        "/admin/tenants/apikey/?q=x",
        "/admin/tenants/usagerecord/?status__exact=ok&q=support",
        "/admin/registry/adapter/?q=support",
        "/admin/registry/adapterversion/?status__exact=ready",
        "/admin/registry/alias/",
        "/admin/audit/auditevent/?q=upload",
        "/admin/registry/basemodel/",
        "/admin/registry/evaluation/?status__exact=passed&q=support",
        "/admin/auth/user/",
    ):
        assert operator.get(url).status_code == 200, url
    tenants = page(operator.get("/admin/tenants/tenant/"))
    assert "column-members" in tenants and "column-adapters" in tenants


@pytest.mark.django_db
def test_suspending_a_tenant_stops_its_keys(operator, tenant_a, make_key, client):
    _, full = make_key(tenant_a)
    act(operator, "tenants/tenant", "suspend", [tenant_a])
    assert Tenant.objects.get(pk=tenant_a.pk).is_active is False
    from django.test import Client

    answer = Client().get("/api/v1/tenant/", headers={"Authorization": f"Bearer {full}"})
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "tenant_suspended"


@pytest.mark.django_db
def test_revoking_keys_from_the_admin_is_audited(operator, tenant_a, make_key):
    key, _ = make_key(tenant_a)
    act(operator, "tenants/apikey", "revoke", [key])
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None
    assert AuditEvent.objects.get(verb="api_key.revoke").actor == "admin:root"


@pytest.mark.django_db
def test_revalidating_a_rejected_version_starts_it_over(operator, adapter, good_adapter_dir):
    version = make_version(adapter, good_adapter_dir, weights=b"broken")
    assert version.status == "rejected"
    act(operator, "registry/adapterversion", "revalidate", [version])
    version.refresh_from_db()
    assert version.status == "pending" and version.report == [] and version.attempts == 0
    assert AuditEvent.objects.filter(verb="version.revalidate", actor="admin:root").exists()


def test_restaging_puts_the_files_back_in_the_adapter_cache(
    operator, adapter, good_adapter_dir, live_worker, settings
):
    from registry import staging

    version = make_version(adapter, good_adapter_dir)
    folder = settings.ADAPTER_CACHE_DIR / version.uid.hex
    # The worker stages a version once it is ready; wait for that, then lose the copy.
    wait_for(lambda: (folder / "adapter_model.safetensors").is_file(), what="first staging")
    staging.unstage(version)
    assert not folder.exists()
    response = act(operator, "registry/adapterversion", "restage", [version])
    assert "Queued staging of 1 version(s)." in page(response)
    wait_for(lambda: (folder / "adapter_model.safetensors").is_file(), what="staging")
    assert (folder / "adapter_config.json").is_file()


@pytest.mark.django_db
def test_pinning_versions_and_aliases_calls_every_engine_with_the_operator_token(
    operator, engine, adapter, good_adapter_dir
):
    version = make_version(adapter, good_adapter_dir)
    alias, _ = alias_set(adapter=adapter, name="production", version_number=1, actor=ALICE_ACTOR)

    act(operator, "registry/adapterversion", "pin", [version])
    act(operator, "registry/alias", "unpin", [alias])
    response = act(operator, "registry/adapter", "pin", [adapter])

    assert [(c.method, c.path, c.body) for c in engine.calls] == [
        ("POST", "/v1/pin_lora_adapter", {"lora_name": "tenant-a/support-bot:1"}),
        ("POST", "/v1/unpin_lora_adapter", {"lora_name": "tenant-a/support-bot@production"}),
        ("POST", "/v1/pin_lora_adapter", {"lora_name": "tenant-a/support-bot@production"}),
    ]
    assert {c.authorization for c in engine.calls} == {"Bearer operator-secret"}
    assert f"Pinned tenant-a/support-bot@production on {engine.url}." in page(response)


@pytest.mark.django_db
def test_an_engine_refusing_a_pin_is_reported(operator, engine, adapter, good_adapter_dir):
    version = make_version(adapter, good_adapter_dir)
    engine.refuse["tenant-a/support-bot:1"] = (409, "v1 is not compatible with tiny-llama")
    response = act(operator, "registry/adapterversion", "pin", [version])
    assert "HTTP 409: v1 is not compatible with tiny-llama" in page(response)


@pytest.mark.django_db
def test_pinning_a_version_that_is_not_ready_is_not_attempted(
    operator, engine, adapter, good_adapter_dir
):
    version = make_version(adapter, good_adapter_dir, weights=b"broken")
    response = act(operator, "registry/adapterversion", "pin", [version])
    assert "only ready versions load" in page(response)
    assert engine.calls == []


@pytest.mark.django_db
def test_pinning_without_an_engine_configured_says_so(operator, adapter, settings):
    settings.ENGINE_URLS = []
    response = act(operator, "registry/adapter", "pin", [adapter])
    assert "No engine is configured: set LORAPLEX_ENGINE_URLS" in page(response)


@pytest.mark.django_db
def test_an_unreachable_engine_is_reported_not_raised(
    operator, adapter, good_adapter_dir, settings
):
    make_version(adapter, good_adapter_dir)
    settings.ENGINE_URLS = ["http://127.0.0.1:9"]  # discard port: nothing listens
    version = AdapterVersion.objects.get()
    response = act(operator, "registry/adapterversion", "pin", [version])
    assert response.status_code == 200
    assert "http://127.0.0.1:9: unreachable" in page(response)


@pytest.mark.django_db
def test_the_engines_page_shows_adapters_by_tier_slots_kv_and_hit_rates(operator, engine):
    index = page(operator.get("/admin/"))
    assert 'href="/admin/engines/"' in index

    html = page(operator.get("/admin/engines/"))
    assert engine.url in html
    assert html.index("<h4>device (1)</h4>") < html.index("<h4>host (1)</h4>")
    assert "tenant-a/support-bot:1" in html and "📌 yes" in html
    assert "<td>2 / 8</td>" in html  # slots
    assert "<td>30 / 120</td>" in html and "<td>25%</td>" in html  # KV blocks, usage
    assert "<td>device</td><td>40</td><td>30</td>\n          <td>75%</td>" in html
    assert [(c.path, c.authorization) for c in engine.calls] == [
        ("/v1/lora_adapters", "Bearer operator-secret"),
        ("/metrics", "Bearer metrics-secret"),  # the metrics token, not the operator's
    ]


@pytest.mark.django_db
def test_the_engines_page_explains_a_missing_configuration(operator, settings):
    settings.ENGINE_URLS = []
    assert "LORAPLEX_ENGINE_URLS" in page(operator.get("/admin/engines/"))


@pytest.mark.django_db
def test_the_engines_page_is_for_staff_only(signed_in, alice, tenant_a):
    response = signed_in(alice).get("/admin/engines/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


# ---------------------------------------------------------------- permissions

MODELS = {
    "tenants/tenant": "tenant",
    "tenants/apikey": "apikey",
    "registry/basemodel": "basemodel",
    "registry/adapter": "adapter",
    "registry/adapterversion": "adapterversion",
    "registry/alias": "alias",
    "registry/evaluation": "evaluation",
}
# (model path, action, the object it would change)
ACTIONS = [
    ("tenants/tenant", "suspend", "tenants/tenant"),
    ("tenants/tenant", "reactivate", "suspended tenant"),
    ("tenants/apikey", "revoke", "tenants/apikey"),
    ("registry/basemodel", "recheck", "registry/basemodel"),
    ("registry/adapter", "pin", "registry/adapter"),
    ("registry/adapter", "unpin", "registry/adapter"),
    ("registry/adapterversion", "revalidate", "rejected version"),
    ("registry/adapterversion", "restage", "registry/adapterversion"),
    ("registry/adapterversion", "promote", "registry/adapterversion"),
    ("registry/adapterversion", "evaluate", "registry/adapterversion"),
    ("registry/adapterversion", "override_quality", "registry/adapterversion"),
    ("registry/adapterversion", "pin", "registry/adapterversion"),
    ("registry/adapterversion", "unpin", "registry/adapterversion"),
    ("registry/alias", "pin", "registry/alias"),
    ("registry/alias", "unpin", "registry/alias"),
]


@pytest.fixture
def staff(django_user_model):
    """staff(*codenames) -> a client signed in as a staff user with just those permissions."""

    def make(*codenames):
        user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
        user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
        client = Client()
        client.force_login(user)
        return client

    return make


@pytest.fixture
def everything(adapter, good_adapter_dir, tenant_a, tenant_b, make_key, monkeypatch):
    """An object for each action to change; queued tasks are recorded, not sent."""
    version = make_version(adapter, good_adapter_dir)
    alias_set(adapter=adapter, name="production", version_number=1, actor=ALICE_ACTOR)
    rejected = make_version(adapter, good_adapter_dir, weights=b"broken")
    key, _ = make_key(tenant_a)
    Tenant.objects.filter(pk=tenant_b.pk).update(is_active=False)
    queued = []
    monkeypatch.setattr(queue, "send_on_commit", lambda *a: queued.append(a))
    return {
        "tenants/tenant": tenant_a,
        "tenants/apikey": key,
        "registry/basemodel": adapter.base_model,
        "registry/adapter": adapter,
        "registry/adapterversion": version,
        "registry/alias": Alias.objects.get(),
        "rejected version": rejected,
        "suspended tenant": tenant_b,
        "queued": queued,
    }


def state() -> tuple:
    return (
        list(Tenant.objects.values("pk", "is_active")),
        list(ApiKey.objects.values("pk", "revoked_at")),
        list(AdapterVersion.objects.values("pk", "status", "attempts", "quality")),
        Evaluation.objects.count(),
        list(Alias.objects.values("pk", "name", "version_id")),
        AuditEvent.objects.count(),
    )


VIEW_ONLY = [f"view_{name}" for name in MODELS.values()]


@pytest.mark.django_db
def test_view_only_staff_see_the_lists_but_no_actions(staff, everything):
    client = staff(*VIEW_ONLY)
    for path in MODELS:
        response = client.get(f"/admin/{path}/")
        assert response.status_code == 200, path
        assert 'name="action"' not in page(response), path


@pytest.mark.django_db
@pytest.mark.parametrize("path, action, target", ACTIONS)
def test_a_forged_action_from_view_only_staff_does_nothing(
    staff, everything, engine, path, action, target
):
    before = state()
    response = act(staff(*VIEW_ONLY), path, action, [everything[target]])
    assert response.status_code == 200  # the list again: no action ran
    assert state() == before
    assert engine.calls == [] and everything["queued"] == []


@pytest.mark.django_db
def test_changing_is_not_operating_the_engines(staff, everything, engine):
    """The change permissions let staff re-validate or suspend, not pin on the engines."""
    client = staff(*VIEW_ONLY, "change_tenant", "change_adapterversion", "change_alias")
    versions = page(client.get("/admin/registry/adapterversion/"))
    assert 'value="revalidate"' in versions and 'value="promote"' in versions
    assert 'value="pin"' not in versions

    act(client, "registry/adapterversion", "pin", [everything["registry/adapterversion"]])
    assert engine.calls == []
    act(client, "tenants/tenant", "suspend", [everything["tenants/tenant"]])
    assert Tenant.objects.get(pk=everything["tenants/tenant"].pk).is_active is False

    assert client.get("/admin/engines/").status_code == 403
    assert 'href="/admin/engines/"' not in page(client.get("/admin/"))


@pytest.mark.django_db
def test_the_operate_engines_permission_pins_and_opens_the_engines_page(staff, everything, engine):
    client = staff(*VIEW_ONLY, "operate_engines")
    act(client, "registry/alias", "pin", [everything["registry/alias"]])
    assert [c.path for c in engine.calls] == ["/v1/pin_lora_adapter"]
    assert client.get("/admin/engines/").status_code == 200
    assert 'href="/admin/engines/"' in page(client.get("/admin/"))
    # ... and nothing else: re-validating still needs the change permission.
    before = state()
    act(client, "registry/adapterversion", "revalidate", [everything["rejected version"]])
    assert state() == before
