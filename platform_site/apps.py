from django.apps import AppConfig


class PlatformSiteConfig(AppConfig):
    """The project itself as an app, so its system checks (checks.py) are registered."""

    name = "platform_site"
    label = "platform_site"

    def ready(self):
        from . import checks  # noqa: F401  (registers them)
