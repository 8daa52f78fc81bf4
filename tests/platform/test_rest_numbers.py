"""Every number the REST API reads is bounded: out of range, infinite, NaN or of five thousand
digits, it is a 400 naming the parameter (or the path's 404), never a 500 from the database."""

import pytest

from registry.models import Alias
from tests.registry.conftest import adapter, base_model, tiny_base_dir  # noqa: F401

pytestmark = pytest.mark.django_db
HUGE = "9" * 400


@pytest.fixture
def client(adapter, make_key, key_client):  # noqa: F811  (the fixture imported above)
    _, full = make_key(adapter.tenant)
    return key_client(full)


def test_alias_numbers_out_of_range_are_400(client):
    for raw, param in [
        ('{"version": 1, "weight": 101}', "weight"),
        ('{"version": 1, "weight": -1}', "weight"),
        ('{"version": 1, "weight": 1e309}', "weight"),
        (f'{{"version": 1, "weight": {HUGE}}}', "weight"),
        ('{"version": 1e309}', "version"),
        ('{"version": 0}', "version"),
        (f'{{"version": {HUGE}}}', "version"),  # beyond any column: no such version
    ]:
        response = client.put(
            "/api/v1/adapters/support-bot/aliases/canary/", raw, content_type="application/json"
        )
        assert response.status_code == 400, (raw, response.content)
        assert response.json()["error"]["param"] == param, raw
    assert not Alias.objects.exists()


def test_the_audit_limit_is_bounded(client):
    for limit in ["0", "1001", "-5", HUGE, "1e309", "nan", "1" + "0" * 5000]:
        response = client.get(f"/api/v1/audit/?limit={limit}")
        assert response.status_code == 400, limit
        assert response.json()["error"]["param"] == "limit"


def test_ids_in_paths_beyond_any_column_are_404(client):
    for path in [
        f"/api/v1/keys/{2**70}/",
        f"/api/v1/adapters/support-bot/versions/{2**70}/",
        f"/api/v1/adapters/support-bot/versions/{HUGE}/",
        "/api/v1/adapters/support-bot/versions/" + "1" * 5000 + "/",
    ]:
        assert client.get(path).status_code == 404, path[:60]
