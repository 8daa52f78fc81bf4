from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.db.models.signals import post_delete, post_save

        from platform_site.error_translations import register_translations

        from . import schema  # noqa: F401  (registers the OpenAPI auth extension)
        from .authentication import TRANSLATIONS
        from .key_cache import forget_key, forget_tenant_keys
        from .models import ApiKey, Tenant

        register_translations(TRANSLATIONS)
        for signal in (post_save, post_delete):
            signal.connect(forget_key, sender=ApiKey, dispatch_uid="key_cache_key")
            signal.connect(forget_tenant_keys, sender=Tenant, dispatch_uid="key_cache_tenant")
