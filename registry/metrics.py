"""The quality gate's Prometheus metrics, read from the database at each scrape.

Evaluations run in the worker, and `/metrics` is served by the web processes: counters kept
in one process's memory would show nothing in the other, so these are computed from the
`Evaluation` rows (one aggregate query per family) wherever `/metrics` is scraped. Rows go
with their versions, so a deleted version's evaluations leave the counts (Prometheus reads a
lower counter as a reset). Every replica reports the same figures: aggregate with `max`.
No tenant or adapter becomes a label.
"""

from __future__ import annotations

import logging

from django.db.models import Count, Q, Sum
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from .models import AdapterVersion, Evaluation

log = logging.getLogger(__name__)
Status = Evaluation.Status
# Seconds: a handful of rows on a small model take well under a second, 200 rows behind
# tenants' traffic on a busy engine minutes.
DURATION_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


class EvaluationCollector:
    """`loraplex_evaluations_*`: run, passed, degraded and failed counters, the queue's length,
    the duration histogram, and the adapter versions per quality state."""

    def describe(self):
        """The families without reading the database (registering calls this, at start)."""
        for name in ("run", "passed", "degraded", "failed"):
            yield CounterMetricFamily(f"loraplex_evaluations_{name}", "")
        yield GaugeMetricFamily("loraplex_evaluations_queued", "")
        yield GaugeMetricFamily("loraplex_evaluations_running", "")
        yield HistogramMetricFamily("loraplex_evaluation_duration_seconds", "")
        yield GaugeMetricFamily("loraplex_adapter_versions_quality", "", labels=["quality"])

    def collect(self):
        try:
            families = list(_families())
        except Exception as exc:  # the database down, or not reachable from here
            # The scrape goes on without them (the engine's metrics matter most when the
            # database is down); /readyz says what is wrong.
            log.warning("quality gate metrics unavailable: %s", exc)
            return
        yield from families


def _families():
    counts = Evaluation.objects.aggregate(
        run=Count("pk", filter=Q(status__in=Evaluation.FINISHED)),
        passed=Count("pk", filter=Q(status=Status.PASSED)),
        degraded=Count("pk", filter=Q(status=Status.DEGRADED)),
        failed=Count("pk", filter=Q(status=Status.FAILED)),
        queued=Count("pk", filter=Q(status=Status.QUEUED)),
        running=Count("pk", filter=Q(status=Status.RUNNING)),
    )
    for name, doc in (
        ("run", "Evaluations finished, whatever their verdict."),
        ("passed", "Evaluations that passed the quality gate."),
        ("degraded", "Evaluations whose perplexity passed a factor of the quality gate."),
        ("failed", "Evaluations that could not measure (engine, eval set, no reference)."),
    ):
        yield CounterMetricFamily(f"loraplex_evaluations_{name}", doc, value=counts[name])
    yield GaugeMetricFamily(
        "loraplex_evaluations_queued",
        "Evaluations waiting for the worker or the engine (queued and running).",
        value=counts["queued"] + counts["running"],
    )
    yield GaugeMetricFamily(
        "loraplex_evaluations_running", "Evaluations being measured now.", value=counts["running"]
    )
    yield _duration_histogram()
    versions = GaugeMetricFamily(
        "loraplex_adapter_versions_quality",
        "Ready adapter versions per quality state (a base model upgrade's progress).",
        labels=["quality"],
    )
    rows = (
        AdapterVersion.objects.filter(status=AdapterVersion.READY)
        .order_by()
        .values("quality")
        .annotate(n=Count("pk"))
    )
    per_state = {row["quality"]: row["n"] for row in rows}
    for state in AdapterVersion.Quality.values:
        versions.add_metric([state], per_state.get(state, 0))
    yield versions


def _duration_histogram() -> HistogramMetricFamily:
    finished = Evaluation.objects.filter(
        status__in=Evaluation.FINISHED, duration_seconds__isnull=False
    )
    aggregates = {
        f"le_{i}": Count("pk", filter=Q(duration_seconds__lte=bound))
        for i, bound in enumerate(DURATION_BUCKETS)
    }
    row = finished.aggregate(total=Count("pk"), seconds=Sum("duration_seconds"), **aggregates)
    buckets = [(repr(bound), row[f"le_{i}"]) for i, bound in enumerate(DURATION_BUCKETS)]
    buckets.append(("+Inf", row["total"]))
    return HistogramMetricFamily(
        "loraplex_evaluation_duration_seconds",
        "From an evaluation's last start to its verdict.",
        buckets=buckets,
        sum_value=row["seconds"] or 0.0,
    )
