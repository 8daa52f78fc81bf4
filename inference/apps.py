from django.apps import AppConfig


class InferenceConfig(AppConfig):
    """Django glue around the engine. `inference.engine` itself never imports Django."""

    name = "inference"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from registry.metrics import EvaluationCollector

        from .engine_host import HOST
        from .metrics import REGISTRY, EngineCollector

        REGISTRY.register(EngineCollector(HOST.stats))
        REGISTRY.register(EvaluationCollector())  # the quality gate's, from the database
