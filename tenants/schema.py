"""Tells drf-spectacular how API keys authenticate, so /api/docs/ offers a Bearer field."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "lpx_<prefix>_<secret>"}
