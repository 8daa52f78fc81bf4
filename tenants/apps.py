from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from platform_site.error_translations import register_translations

        from . import schema  # noqa: F401  (registers the OpenAPI auth extension)
        from .authentication import TRANSLATIONS

        register_translations(TRANSLATIONS)
