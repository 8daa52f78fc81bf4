"""The serving layer's routes outside /v1/: the Prometheus scrape, and vLLM's tokenizer
endpoints (vLLM serves them at the root too, so its clients find them here)."""

from django.urls import path

from .metrics_endpoint import prometheus_metrics
from .openai import views as openai_views

urlpatterns = [
    path("metrics", prometheus_metrics, name="metrics"),
    path("tokenize", openai_views.tokenize_view, name="tokenize"),
    path("detokenize", openai_views.detokenize_view, name="detokenize"),
]
