from django.apps import AppConfig


class WebConfig(AppConfig):
    """Server-rendered pages for tenant members, thin over the tenants and registry services."""

    name = "web"
    default_auto_field = "django.db.models.BigAutoField"
