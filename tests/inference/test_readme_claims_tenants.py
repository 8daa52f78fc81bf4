"""What the README says about who reaches which tenant's models, against a live `serve`: a
signed-in member calls /v1 with the session only with the CSRF token (the playground's path),
for a tenant they belong to, chosen with `X-Loraplex-Tenant`; an API key always acts for its
own tenant, header or not; /v1/completions keeps tenants apart like chat does.
"""

from functools import partial

import httpx
import pytest

from tests import clients
from tests.inference.conftest import BASE_NAME

pytestmark = pytest.mark.django_db
QUESTION = [{"role": "user", "content": "Say something."}]
chat = partial(clients.chat, messages=QUESTION, max_tokens=3)  # a session's: no key
SOLO = ("solo@example.com", "solo-password-1")  # a member of serve-a only
TWOFOLD = ("twofold@example.com", "twofold-password-1")  # a member of serve-a and serve-b


@pytest.fixture(scope="module")
def members(serve_data, django_db_blocker):
    """Committed users the server checks with its own (default, PBKDF2) hasher."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password

    from tenants.models import Tenant
    from tenants.scopes import MEMBER
    from tenants.services import membership_set, user_get_or_create

    with django_db_blocker.unblock():
        serve_a, serve_b = (Tenant.objects.get(slug=s) for s in ("serve-a", "serve-b"))
        for (email, password), tenants in [(SOLO, [serve_a]), (TWOFOLD, [serve_a, serve_b])]:
            user = user_get_or_create(email=email)
            user.password = make_password(password, hasher="pbkdf2_sha256")
            user.save()
            for tenant in tenants:
                membership_set(tenant=tenant, user=user, role=MEMBER)
    yield
    with django_db_blocker.unblock():
        get_user_model().objects.filter(email__in=[SOLO[0], TWOFOLD[0]]).delete()


def sign_in(server, email: str, password: str) -> httpx.Client:
    """A browser-like client: the login form with its CSRF token, then the session cookie."""
    client = httpx.Client(base_url=server.url, timeout=60)
    client.get("/login/")
    response = client.post(
        "/login/",
        data={
            "username": email,
            "password": password,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
    )
    assert response.status_code == 302, response.text
    assert "sessionid" in client.cookies
    return client


def csrf(client: httpx.Client, **headers) -> dict:
    """What the playground sends: the CSRF cookie's value back in a header."""
    return {"X-CSRFToken": client.cookies["csrftoken"], **headers}


def model_ids(response: httpx.Response) -> set[str]:
    assert response.status_code == 200, response.text
    return {m["id"] for m in response.json()["data"]}


def error_code(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]["code"]


@pytest.fixture
def solo(live_engine_server, members):
    client = sign_in(live_engine_server, *SOLO)
    yield client
    client.close()


@pytest.fixture
def twofold(live_engine_server, members):
    client = sign_in(live_engine_server, *TWOFOLD)
    yield client
    client.close()


# ---------------------------------------------------------------- sessions (the playground)


def test_a_member_chats_with_the_session_and_the_csrf_token(solo):
    response = chat(solo, model="pirate", headers=csrf(solo))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "pirate" and body["choices"][0]["message"]["content"]


def test_a_session_call_without_the_csrf_token_is_refused(solo):
    assert error_code(chat(solo, model="pirate"), 403) == "csrf_failed"
    wrong = {"X-CSRFToken": "x" * 32}
    assert error_code(chat(solo, model="pirate", headers=wrong), 403) == "csrf_failed"


def test_a_session_lists_its_tenants_models(solo):
    assert {BASE_NAME, "pirate", "pirate@production"} <= model_ids(solo.get("/v1/models"))


def test_a_session_cannot_choose_a_tenant_it_is_not_a_member_of(solo):
    foreign = {"X-Loraplex-Tenant": "serve-b"}  # exists, but solo is not a member
    assert error_code(solo.get("/v1/models", headers=foreign), 403) == "no_tenant"
    answer = chat(solo, model=BASE_NAME, headers=csrf(solo, **foreign))
    assert error_code(answer, 403) == "no_tenant"


def test_a_member_of_two_tenants_chooses_one_with_the_header(twofold):
    in_a = {"X-Loraplex-Tenant": "serve-a"}
    in_b = {"X-Loraplex-Tenant": "serve-b"}
    assert "pirate" in model_ids(twofold.get("/v1/models", headers=in_a))
    assert model_ids(twofold.get("/v1/models", headers=in_b)) == {BASE_NAME}
    assert chat(twofold, model="pirate", headers=csrf(twofold, **in_a)).status_code == 200
    refused = chat(twofold, model="pirate", headers=csrf(twofold, **in_b))
    assert error_code(refused, 404) == "model_not_found"


# ---------------------------------------------------------------- API keys


def test_an_api_key_acts_for_its_own_tenant_whatever_the_header(live_engine_server):
    def models(key, slug):
        return httpx.get(
            f"{live_engine_server.url}/v1/models",
            headers={"Authorization": f"Bearer {key}", "X-Loraplex-Tenant": slug},
        )

    assert model_ids(models(live_engine_server.key_b, "serve-a")) == {BASE_NAME}
    assert "pirate" in model_ids(models(live_engine_server.key_a, "serve-b"))
    client = live_engine_server.openai(live_engine_server.key_b)
    with pytest.raises(Exception) as caught:
        client.chat.completions.create(
            model="pirate",
            messages=QUESTION,
            max_tokens=2,
            extra_headers={"X-Loraplex-Tenant": "serve-a"},
        )
    assert caught.value.status_code == 404 and caught.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("name", ["pirate", "pirate@production", "pirate:1"])
def test_completions_of_another_tenants_adapter_are_404_like_a_missing_one(
    live_engine_server, name
):
    def complete(model):
        return httpx.post(
            f"{live_engine_server.url}/v1/completions",
            json={"model": model, "prompt": "Once upon", "max_tokens": 2},
            headers={"Authorization": f"Bearer {live_engine_server.key_b}"},
            timeout=60,
        )

    theirs, missing = complete(name), complete("no-such-adapter")
    assert error_code(theirs, 404) == error_code(missing, 404) == "model_not_found"
    assert theirs.json()["error"]["message"].replace(name, "X") == missing.json()["error"][
        "message"
    ].replace("no-such-adapter", "X")
    # ... and the owner's key is answered, so the 404 is about the caller, not the name.
    owner = httpx.post(
        f"{live_engine_server.url}/v1/completions",
        json={"model": name, "prompt": "Once upon", "max_tokens": 2},
        headers={"Authorization": f"Bearer {live_engine_server.key_a}"},
        timeout=60,
    )
    assert owner.status_code == 200, owner.text


# ---------------------------------------------------------------- the REST API


def test_the_rest_api_refuses_a_tenant_header_naming_someone_elses_tenant(
    tenant_a, tenant_b, alice, user_client, make_key
):
    client = user_client(alice)
    foreign = {"HTTP_X_LORAPLEX_TENANT": tenant_b.slug}  # charlie's tenant: it exists
    for path in ("/api/v1/tenant/", "/api/v1/adapters/", "/api/v1/keys/"):
        response = client.get(path, **foreign)
        assert response.status_code == 403, (path, response.content)
        assert response.json()["error"]["code"] == "no_tenant"
    _, key = make_key(tenant_a)
    keyed = user_client(alice)
    keyed.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert keyed.get("/api/v1/tenant/", **foreign).json()["slug"] == tenant_a.slug
