"""A fuzz worker's own Prometheus endpoint (``attnfuzz fuzz --metrics-port PORT``).

``/metrics`` of the web service reads the database, so it can only show what was stored; this one
is served by the worker process itself (``prometheus_client.start_http_server`` on a registry of
its own) and shows what only the worker knows, read at each scrape from the running `Worker`,
its `SpoolingSink` and its executor:

=================================================  =======  =====================================
``attnfuzz_worker_seconds_total{part}``            counter  wall time by part: ``oracle``,
                                                            ``kernels``, ``jit``, ``shrinking``,
                                                            ``other`` (inputs, comparison,
                                                            storage, processes)
``attnfuzz_worker_cases_total``                    counter  cases evaluated by this run
``attnfuzz_worker_evaluations_total{backend,status}``  counter  backend results produced
``attnfuzz_worker_spool_pending_writes``           gauge    writes waiting in the local spool for
                                                            the database
``attnfuzz_worker_database_outages_total``         counter  times the database went away
``attnfuzz_worker_child_restarts_total``           counter  backend child processes started again
                                                            (crash, timeout, lost pipe, oom)
``attnfuzz_worker_build_info{...}``                info     attnfuzz version, device, torch,
                                                            hostname, database
=================================================  =======  =====================================

Everything is read without locks from plain attributes (ints and floats), so a scrape from the
server thread never touches the worker's SQLite connections.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from fuzzer.text import masked_url


class WorkerCollector(Collector):
    """The families above for one worker run; ``worker`` may be None until it exists."""

    def __init__(self, sink: Any, info: dict[str, str]):
        self.worker: Any = None
        self.sink = sink
        self.info = info
        self._restarts_before = 0  # restarts of executors the worker already closed
        self._executor: Any = None

    def _restarts(self) -> int:
        executor = getattr(self.worker, "_executor", None)
        if executor is not self._executor:
            if self._executor is not None:
                self._restarts_before += getattr(self._executor, "restarts", 0)
            self._executor = executor
        return self._restarts_before + (getattr(executor, "restarts", 0) if executor is not None else 0)

    def collect(self) -> Iterator[Metric]:
        info = InfoMetricFamily("attnfuzz_worker_build", "This worker's attnfuzz version, device, torch and host.")
        info.add_metric([], self.info)
        yield info
        stats = getattr(self.worker, "stats", None)
        seconds = CounterMetricFamily("attnfuzz_worker_seconds", "Wall time of this worker run by part.", labels=["part"])
        cases = CounterMetricFamily("attnfuzz_worker_cases", "Cases this worker run evaluated.")
        results = CounterMetricFamily(
            "attnfuzz_worker_evaluations", "Backend results this worker run produced.", labels=["backend", "status"]
        )
        if stats is not None:
            started = getattr(self.worker, "_started", None)
            wall = stats.wall_s or (time.monotonic() - started if started else 0.0)
            parts = {"oracle": stats.oracle_s, "kernels": stats.kernel_s, "jit": stats.compile_s, "shrinking": stats.shrink_s}
            parts["other"] = max(wall - sum(parts.values()), 0.0)
            for part, value in parts.items():
                seconds.add_metric([part], value)
            cases.add_metric([], stats.cases)
            for (backend, status), n in sorted(stats.per_backend.items()):
                results.add_metric([backend, status], n)
        yield seconds
        yield cases
        yield results
        pending = GaugeMetricFamily("attnfuzz_worker_spool_pending_writes", "Writes waiting in the spool for the database.")
        pending.add_metric([], max(getattr(self.sink, "spooled", 0) - getattr(self.sink, "flushed", 0), 0))
        yield pending
        outages = CounterMetricFamily("attnfuzz_worker_database_outages", "Times the database went away.")
        outages.add_metric([], getattr(self.sink, "outages", 0))
        yield outages
        restarts = CounterMetricFamily("attnfuzz_worker_child_restarts", "Backend child processes started again.")
        restarts.add_metric([], self._restarts())
        yield restarts


def serve_worker_metrics(port: int, sink: Any, *, device: str, database: str, addr: str = "127.0.0.1") -> tuple[WorkerCollector, Any]:
    """Start the endpoint on ``addr:port`` (0: any free port) in a daemon thread.

    Returns:
        ``(collector, server)``: set ``collector.worker`` once the worker exists; call
        ``server.shutdown()`` at the end; ``server.server_port`` is the port bound.

    Raises:
        OSError: the port cannot be bound.
    """
    import torch

    from service import __version__

    registry = CollectorRegistry(auto_describe=False)
    collector = WorkerCollector(
        sink,
        {"version": __version__, "device": device, "torch": torch.__version__, "hostname": socket.gethostname(),
         "database": masked_url(database)},
    )
    registry.register(collector)
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return collector, server
