"""`tests.processes.committed`: what a live process committed, read from a `django_db` test.

A test's own reads run inside the transaction wrapping it, and on SQLite (WAL) they keep the
snapshot the first one took: a row a live server commits afterwards stays invisible to them
(tests/inference/operator/test_operator_load.py saw one version where the server had
registered two). `committed` reads on a connection of its own.
"""

import pytest
from django.db import connection

from tenants.models import Tenant
from tests.processes import committed


@pytest.mark.django_db
def test_a_row_committed_after_the_tests_first_read_is_read_through_committed():
    rows = Tenant.objects.filter(slug="committed-elsewhere")
    assert not rows.exists()  # the test's first read
    # Another connection commits, as a live server does.
    committed(lambda: Tenant.objects.create(slug="committed-elsewhere", name="Elsewhere"))
    try:
        assert committed(rows.exists)
        if connection.vendor == "sqlite":
            assert not rows.exists()  # the test's own snapshot: before the commit
    finally:
        committed(rows.delete)
