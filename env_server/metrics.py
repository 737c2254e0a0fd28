"""Prometheus metrics of one env server, in a registry of its own (so tests can run several servers),
and the HTTP endpoint that serves them. The names are an interface: dashboards and the HPA use them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Toy steps take ~0.1 ms, ALFWorld steps ~10-100 ms, resets up to seconds.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                     60.0)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.active_sessions = Gauge("limen_active_sessions", "Live episodes (holding an env) by env",
                                     ["env"], registry=r)
        self.session_capacity = Gauge("limen_session_capacity", "Live episodes this server admits at once",
                                      registry=r)
        self.draining = Gauge("limen_draining", "1 while the server drains before exit", registry=r)
        self.resets = Counter("limen_resets_total", "Episodes started, by env", ["env"], registry=r)
        self.steps = Counter("limen_steps_total", "Env steps applied (retries answered from store excluded)",
                             ["env"], registry=r)
        self.reset_latency = Histogram("limen_reset_latency_seconds", "Reset time in the server, queueing "
                                       "for the worker included", ["env"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.step_latency = Histogram("limen_step_latency_seconds", "Step time in the server, queueing for "
                                      "the worker included", ["env"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.errors = Counter("limen_errors_total", "RPCs answered with an error, by method and status code",
                              ["method", "code"], registry=r)
        self.worker_rss_bytes = Gauge("limen_worker_rss_bytes", "Resident memory of each worker process",
                                      ["env", "worker"], registry=r)
        self.worker_restarts = Counter("limen_worker_restarts_total", "Workers replaced, by env and reason "
                                       "(crashed, timeout, episodes, rss)", ["env", "reason"], registry=r)
        self.sessions_restored = Counter("limen_sessions_restored_total", "Sessions rebuilt by replay on "
                                         "another worker after theirs died", registry=r)

    def forget_worker(self, env: str, pid: int) -> None:
        """Drop a gone worker's series, so recycled pids do not pile up as stale labels."""
        with contextlib.suppress(KeyError):  # never polled: it died young
            self.worker_rss_bytes.remove(env, str(pid))

    def serve_http(self, host: str, port: int) -> tuple[int, Callable[[], None]]:
        """Start the /metrics endpoint (port 0 = a free one); returns the bound port and a stopper."""
        httpd, thread = start_http_server(port, addr=host, registry=self.registry)

        def stop() -> None:
            httpd.shutdown()
            httpd.server_close()
            thread.join(timeout=5)

        return httpd.server_address[1], stop
