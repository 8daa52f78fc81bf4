import pytest
from django.core.management import CommandError, call_command

from tenants.keyauth import api_key_from_header
from tenants.models import Membership, Tenant

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    from io import StringIO

    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_create_tenant_with_owner():
    run("create_tenant", "acme", "--name", "Acme", "--owner-email", "o@acme.test")
    membership = Membership.objects.get()
    assert (membership.tenant.slug, membership.user.email, membership.role) == (
        "acme",
        "o@acme.test",
        "owner",
    )


def test_create_tenant_refuses_a_duplicate_and_a_bad_slug():
    run("create_tenant", "acme")
    with pytest.raises(CommandError, match="slug"):
        run("create_tenant", "acme")
    with pytest.raises(CommandError, match="slug"):
        run("create_tenant", "../etc")
    assert Tenant.objects.count() == 1


def test_create_api_key_prints_the_key_alone_on_the_last_line():
    run("create_tenant", "acme")
    out = run(
        "create_api_key",
        "acme",
        "--name",
        "ci",
        "--scopes",
        "inference,registry:read",
        "--expires-in-days",
        "3",
    )
    key = out.strip().splitlines()[-1]
    api_key = api_key_from_header(f"Bearer {key}")
    assert api_key.scopes == ["inference", "registry:read"] and api_key.expires_at is not None


@pytest.mark.parametrize(
    "args, message",
    [
        (["nobody", "--name", "x", "--scopes", "inference"], "No tenant"),
        (["acme", "--name", "x", "--scopes", "admin"], "Unknown scope"),
        (["acme", "--name", "x", "--scopes", "inference", "--expires-in-days", "0"], "positive"),
    ],
)
def test_create_api_key_errors(args, message):
    run("create_tenant", "acme")
    with pytest.raises(CommandError, match=message):
        run("create_api_key", *args)


def test_bootstrap_demo_is_idempotent_and_prints_a_working_key():
    first = run("bootstrap_demo").strip().splitlines()[-1]
    second = run("bootstrap_demo").strip().splitlines()[-1]
    assert first == second
    assert api_key_from_header(f"Bearer {first}").tenant.slug == "demo"
