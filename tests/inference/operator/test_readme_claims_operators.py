"""What the README says operators can do, against a live `manage.py serve` with a real engine:
the operator endpoints (with LORAPLEX_OPERATOR_TOKEN, never with a tenant's key),
LORAPLEX_PINNED_ADAPTERS at start-up, and the admin's pin/unpin actions reaching the engine
through LORAPLEX_ENGINE_URLS.
"""

import re

import httpx
import pytest

from platform_site import operator_protocol as protocol
from tests.inference.conftest import BASE_NAME, start_server, stop_server
from tests.peft_adapters import make_peft_adapter

pytestmark = pytest.mark.django_db
TOKEN = "claims-operator-token"
PINNED = "serve-a/pirate@production"  # what LORAPLEX_PINNED_ADAPTERS names
PIRATE_V1 = "serve-a/pirate:1"  # how the engine lists it: the version it resolved to
ACTIONS = [protocol.LOAD, protocol.UNLOAD, protocol.PIN, protocol.UNPIN]


@pytest.fixture(scope="module")
def parrot(serve_data, django_db_blocker):
    """A second ready adapter of tenant A that no request has loaded yet (serve_data's
    teardown deletes it with the tenant)."""
    from registry.models import Adapter
    from registry.services.adapters import adapter_create
    from registry.services.versions import adapter_version_create, adapter_version_validate
    from tenants.models import Tenant

    folder = make_peft_adapter(
        serve_data["base_dir"],
        serve_data["tmp"] / "parrot",
        rank=4,
        seed=7,
        base_model_name=BASE_NAME,
    )
    with django_db_blocker.unblock():
        adapter = adapter_create(
            tenant=Tenant.objects.get(slug="serve-a"), name="parrot", actor="test"
        )
        with (
            open(folder / "adapter_config.json", "rb") as c,
            open(folder / "adapter_model.safetensors", "rb") as w,
        ):
            version, _ = adapter_version_create(adapter=adapter, config=c, weights=w, actor="test")
        assert adapter_version_validate(version_id=version.pk).status == "ready"
        yield Adapter.objects.get(pk=adapter.pk)


@pytest.fixture(scope="module")
def operator_server(serve_data, parrot):
    """`serve` with the operator token and one adapter pinned at start-up; what the engine
    held before any request is recorded as it starts."""
    url, proc, log = start_server(
        serve_data["tmp"],
        {
            "LORAPLEX_OPERATOR_TOKEN": TOKEN,
            "LORAPLEX_PINNED_ADAPTERS": PINNED,
            "LORAPLEX_MAX_LORAS": "4",  # room to pin up to three
        },
    )
    at_start = {"adapters": listed(url), "metrics": httpx.get(f"{url}/metrics").text}
    yield url, at_start
    stop_server(proc)


def operator_call(url, action, lora_name=None, authorization=f"Bearer {TOKEN}"):
    headers = {"Authorization": authorization} if authorization else {}
    if action == protocol.LIST:
        return httpx.get(url + protocol.path(action), headers=headers, timeout=60)
    return httpx.post(
        url + protocol.path(action),
        json={protocol.LORA_NAME: lora_name},
        headers=headers,
        timeout=60,
    )


def listed(url) -> dict[str, dict]:
    response = operator_call(url, protocol.LIST)
    assert response.status_code == 200, response.text
    return {entry["name"]: entry for entry in response.json()["data"]}


def test_a_pinned_adapter_is_loaded_and_pinned_before_the_first_request(operator_server):
    _, at_start = operator_server
    assert set(at_start["adapters"]) == {PIRATE_V1}
    entry = at_start["adapters"][PIRATE_V1]
    assert entry["pinned"] is True and entry["loading"] is False
    assert entry["tier"] in ("device", "host")  # in memory, not merely known on disk
    loads = re.search(r"^loraplex_lora_loads_total (\S+)$", at_start["metrics"], re.M)
    assert loads and float(loads.group(1)) == 1


@pytest.mark.parametrize("action", [*ACTIONS, protocol.LIST])
def test_a_tenant_key_is_not_an_operator(operator_server, serve_data, action):
    url, _ = operator_server
    before = listed(url)
    key_a = serve_data["keys"][0]  # every scope tenant A has
    response = operator_call(url, action, "serve-a/parrot", authorization=f"Bearer {key_a}")
    assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "operator_only"
    anonymous = operator_call(url, action, "serve-a/parrot", authorization=None)
    assert anonymous.status_code == 401, anonymous.text
    assert listed(url) == before


def test_the_operator_token_loads_pins_unpins_and_unloads(operator_server, parrot):
    url, _ = operator_server
    name = "serve-a/parrot:1"
    for action, expected in [
        (protocol.LOAD, {"pinned": True, "loading": False}),  # loaded, and pinned with it
        (protocol.UNPIN, {"pinned": False}),
        (protocol.PIN, {"pinned": True}),
    ]:
        response = operator_call(url, action, "serve-a/parrot")
        assert response.status_code == 200, response.text
        assert response.json() == {
            protocol.LORA_NAME: "serve-a/parrot",
            "action": action,
            "status": "ok",
        }
        entry = listed(url)[name]
        assert {k: entry[k] for k in expected} == expected, (action, entry)
    assert operator_call(url, protocol.UNLOAD, "serve-a/parrot").status_code == 200
    assert name not in listed(url)
    assert PIRATE_V1 in listed(url)  # the others stay


@pytest.fixture
def admin_for(operator_server, client, django_user_model, settings):
    """The admin of this process, pointed at the live engine as the README configures it."""
    url, _ = operator_server
    settings.ENGINE_URLS = [url]
    settings.OPERATOR_TOKEN = TOKEN
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(root)
    return client


def admin_action(client, model_path, action, objects) -> str:
    response = client.post(
        f"/admin/{model_path}/",
        {"action": action, "_selected_action": [o.pk for o in objects]},
        follow=True,
    )
    assert response.status_code == 200
    return response.content.decode()


def test_the_admin_unpins_and_pins_an_alias_on_the_engine(admin_for, operator_server):
    from registry.models import Alias

    url, _ = operator_server
    production = Alias.objects.get(adapter__tenant__slug="serve-a", adapter__name="pirate")

    html = admin_action(admin_for, "registry/alias", "unpin", [production])
    assert f"Unpinned {PINNED} on {url}." in html
    assert listed(url)[PIRATE_V1]["pinned"] is False

    html = admin_action(admin_for, "registry/alias", "pin", [production])
    assert f"Pinned {PINNED} on {url}." in html
    assert listed(url)[PIRATE_V1]["pinned"] is True


def test_the_admin_pins_a_version_the_engine_has_not_loaded(admin_for, operator_server, parrot):
    url, _ = operator_server
    operator_call(url, protocol.UNLOAD, "serve-a/parrot")  # whatever an earlier test left
    assert "serve-a/parrot:1" not in listed(url)
    version = parrot.versions.get(number=1)

    html = admin_action(admin_for, "registry/adapterversion", "pin", [version])
    assert f"Pinned serve-a/parrot:1 on {url}." in html, html
    entry = listed(url)["serve-a/parrot:1"]
    assert entry["pinned"] is True

    html = admin_action(admin_for, "registry/adapterversion", "unpin", [version])
    assert f"Unpinned serve-a/parrot:1 on {url}." in html
    assert listed(url)["serve-a/parrot:1"]["pinned"] is False
