"""The serving layer's routes outside /v1/: the Prometheus scrape."""

from django.urls import path

from .metrics_endpoint import prometheus_metrics

urlpatterns = [path("metrics", prometheus_metrics, name="metrics")]
