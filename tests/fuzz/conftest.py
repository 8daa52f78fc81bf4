"""API fuzzing with Schemathesis: requests generated from the OpenAPI schema at /api/schema/.

The schema is read once, in-process, when this package is collected (Schemathesis builds one
test per operation from it). The REST API is called in-process through the WSGI app, inside
the test's transaction; the /v1 endpoints need an engine, so they are called over HTTP on a
live `manage.py serve`. Every run is bounded (examples per operation, no shrinking), and the
check that matters is Schemathesis's `not_a_server_error`: no input a client can send may
produce a 5xx.
"""

import schemathesis
from django.core.wsgi import get_wsgi_application

from tests.inference.conftest import serve_data  # noqa: F401  (fixtures, re-exported)
from tests.registry.conftest import (  # noqa: F401
    adapter,
    base_model,
    good_adapter_dir,
    registry_settings,  # autouse: a private object store and adapter cache per test
    tiny_base_dir,
)

# Coverage (boundary values of every parameter), then fuzzing: positive and negative inputs.
# No stateful phase: it would chain operations far past the time this suite can spend.
CONFIG = {
    "generation": {"max-examples": 15, "no-shrink": True, "deterministic": True},
    "phases": {"stateful": {"enabled": False}},
}
SCHEMA = schemathesis.openapi.from_wsgi(
    "/api/schema/", get_wsgi_application(), config=schemathesis.Config.from_dict(CONFIG)
)
