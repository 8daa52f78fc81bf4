"""The serving layer's endpoints in the OpenAPI schema at /api/schema/.

They are plain async Django views, which drf-spectacular does not see, so this
postprocessing hook (SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]) adds their fragments:
/api/docs/ then shows every API a caller has, and the API fuzz tests (tests/fuzz/) generate
requests for them from the same description.
"""

from .openai import openapi as openai_api
from .openai import openapi_tokenize as tokenize_api
from .openai.responses import openapi as responses_api
from .operator import openapi as operator_api


def add_v1_paths(result: dict, generator=None, request=None, public=None) -> dict:
    """drf-spectacular postprocessing hook: the /v1 paths (and vLLM's /tokenize and
    /detokenize), their schemas and security."""
    result.setdefault("paths", {}).update(
        openai_api.PATHS | responses_api.PATHS | tokenize_api.PATHS | operator_api.PATHS
    )
    components = result.setdefault("components", {})
    components.setdefault("schemas", {}).update(
        openai_api.SCHEMAS | responses_api.SCHEMAS | tokenize_api.SCHEMAS | operator_api.SCHEMAS
    )
    components.setdefault("securitySchemes", {}).update(operator_api.SECURITY_SCHEMES)
    tags = result.setdefault("tags", [])
    tags.extend({"name": name} for name in (openai_api.OPENAI_TAG, operator_api.OPERATOR_TAG))
    return result
