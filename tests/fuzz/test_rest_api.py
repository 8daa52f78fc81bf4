"""Fuzzing the REST API (/api/v1/...) from its OpenAPI schema: no request is answered with a 5xx.

In-process through the WSGI app with a key holding every scope, so requests get past
authentication into the views, serializers and services.
"""

import zlib

import pytest
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from tests.fuzz.checks import error_param_is_a_string_or_null
from tests.fuzz.conftest import SCHEMA

REST = SCHEMA.include(path_regex="^/api/")


@pytest.fixture
def same_connection():
    """Django closes the database connection after each request; the test client stops that,
    and so must a WSGI client inside the test's transaction."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def fuzz_key(db, tenant_a, make_key, adapter, good_adapter_dir, same_connection):
    """A key of tenant A with every scope; the tenant has `support-bot` with a ready v1 behind
    `production`, for the paths that name an adapter, a version or an alias."""
    from registry.services.aliases import alias_set
    from tests.ui.conftest import make_version

    make_version(adapter, good_adapter_dir)
    alias_set(adapter=adapter, name="production", version_number=1, actor="test")
    return make_key(tenant_a)[1]


# Most generated path parameters are swapped (deterministically) for these, so requests reach
# the objects' views and services instead of stopping at 404.
REAL = {"name": "support-bot", "number": 1, "alias": "production"}


def aim_at_real_objects(case) -> None:
    params = case.path_parameters or {}
    for name, value in params.items():
        if name in REAL and zlib.crc32(repr((name, value, case.body)).encode()) % 4:
            params[name] = REAL[name]


@REST.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_no_rest_request_is_answered_with_a_server_error(case, fuzz_key):
    aim_at_real_objects(case)
    case.headers = {**(case.headers or {}), "Authorization": f"Bearer {fuzz_key}"}
    case.call_and_validate(checks=[not_a_server_error, error_param_is_a_string_or_null])
