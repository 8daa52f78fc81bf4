from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Adapter registry"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from platform_site.body_limits import register_route_limits

        from .body_limits import ROUTE_LIMITS

        register_route_limits(ROUTE_LIMITS)
