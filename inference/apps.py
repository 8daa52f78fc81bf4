from django.apps import AppConfig


class InferenceConfig(AppConfig):
    """Django glue around the engine. `inference.engine` itself never imports Django."""

    name = "inference"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from platform_site.error_translations import register_translations
        from registry.metrics import EvaluationCollector

        from .errors import ENGINE_ERRORS
        from .host.engine_host import HOST
        from .metrics import REGISTRY, EngineCollector

        register_translations(ENGINE_ERRORS)
        REGISTRY.register(EngineCollector(HOST.stats, HOST.served_name))
        REGISTRY.register(EvaluationCollector())  # the quality gate's, from the database
