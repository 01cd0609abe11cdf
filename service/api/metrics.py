"""``/metrics`` in the Prometheus text format: cases, results and failures, buckets, workers.

Nothing is counted in the process: every scrape reads the database (`stats.metrics_snapshot`)
and renders it through a custom collector on a registry made for that scrape, so several workers
and several service processes report the same numbers. Metric families:

====================================================  =======  ===================================
``attnfuzz_cases``                                    gauge    stored cases
``attnfuzz_results_total``                            counter  results by ``backend``, ``status``
``attnfuzz_failures_total``                           counter  failing results by ``backend``,
                                                               ``variant``, ``signature`` (bucket
                                                               hit counts)
``attnfuzz_buckets``                                  gauge    buckets by ``backend`` and
                                                               ``triage_state``
``attnfuzz_workers_live``                             gauge    running workers heard from in the
                                                               last 300 s
``attnfuzz_worker_last_heartbeat_timestamp_seconds``  gauge    Unix time of each worker's last
                                                               heartbeat (seen in the last 24 h);
                                                               ``time() - x`` is its age
``attnfuzz_worker_cases_total``                       counter  cases each worker reported at its
                                                               last heartbeat (cumulative)
``attnfuzz_build_info``                               info     the service's attnfuzz version
====================================================  =======  ===================================

Names follow the Prometheus conventions: base units (seconds), ``_total`` on counters (the
client adds it), timestamps as ``..._timestamp_seconds`` gauges rather than ages (so a stale
scrape does not lie), one ``_info`` family for versions. What a worker measures itself (time
split, spool depth, outages, child restarts) is on the worker's own endpoint,
`service.worker_metrics` (``attnfuzz fuzz --metrics-port``).

Source: Prometheus exposition format, "Metric and label naming" and ``prometheus_client`` custom
collectors (https://prometheus.io/docs/practices/naming/,
https://prometheus.github.io/client_python/collector/custom/).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timezone

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from service.db import stats
from service.api.deps import SessionDep

router = APIRouter(tags=["metrics"])


class SnapshotCollector(Collector):
    """Yields the metric families of one `stats.MetricsSnapshot`."""

    def __init__(self, snapshot: stats.MetricsSnapshot):
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        yield from snapshot_metrics(self._snapshot)


def snapshot_metrics(snapshot: stats.MetricsSnapshot) -> Iterator[Metric]:
    """The metric families of one snapshot (see the module docstring)."""
    cases = GaugeMetricFamily("attnfuzz_cases", "Stored attention cases.")
    cases.add_metric([], snapshot.cases)
    yield cases
    results = CounterMetricFamily("attnfuzz_results", "Stored results by backend and status.", labels=["backend", "status"])
    for (backend, status), n in sorted(snapshot.results.items()):
        results.add_metric([backend, status], n)
    yield results
    failures = CounterMetricFamily(
        "attnfuzz_failures", "Failing results by bucket.", labels=["backend", "variant", "signature"]
    )
    for (backend, variant, signature), n in sorted(snapshot.bucket_hits.items()):
        failures.add_metric([backend, variant, signature], n)
    yield failures
    buckets = GaugeMetricFamily("attnfuzz_buckets", "Buckets by backend and triage state.", labels=["backend", "triage_state"])
    for (backend, state), n in sorted(snapshot.buckets.items()):
        buckets.add_metric([backend, state], n)
    yield buckets
    live = GaugeMetricFamily("attnfuzz_workers_live", "Running workers with a heartbeat in the last 300 s.")
    live.add_metric([], snapshot.live_workers)
    yield live
    labels = ["worker_id", "hostname", "device"]
    beat = GaugeMetricFamily(
        "attnfuzz_worker_last_heartbeat_timestamp_seconds", "Unix time of the worker's last heartbeat.", labels=labels
    )
    run = CounterMetricFamily("attnfuzz_worker_cases", "Cases the worker reported at its last heartbeat.", labels=labels)
    for w in snapshot.workers:
        key = [str(w.worker.id), w.worker.hostname, w.worker.device]
        last = w.worker.last_heartbeat
        if last.tzinfo is None:  # stored as UTC
            last = last.replace(tzinfo=timezone.utc)
        beat.add_metric(key, last.timestamp())
        run.add_metric(key, w.worker.cases_run)
    yield beat
    yield run
    from service import __version__

    info = InfoMetricFamily("attnfuzz_build", "The attnfuzz version serving these metrics.")
    info.add_metric([], {"version": __version__})
    yield info


def render(snapshot: stats.MetricsSnapshot) -> bytes:
    """The snapshot in the Prometheus text format (a registry of its own: no process metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    return generate_latest(registry)


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
def metrics(session: SessionDep) -> Response:
    """Prometheus metrics (text exposition format 0.0.4), read from the database at each scrape."""
    return Response(render(stats.metrics_snapshot(session)), media_type=CONTENT_TYPE_LATEST)
