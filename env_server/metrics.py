"""Prometheus metrics of one env server, in a registry of its own (so tests can run several servers),
and the HTTP endpoint that serves them. The names are an interface: dashboards and the HPA use them."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from collections.abc import Callable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

# The metrics endpoint serves each connection on a thread of its own: a client that opens connections and
# never finishes its request would pin one thread each. A scrape takes milliseconds, so a connection silent
# this long is dropped, and past this many at once a new one is closed at once (a scraper retries).
METRICS_READ_TIMEOUT_S = 10.0
METRICS_MAX_CONNECTIONS = 8

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

    def serve_http(self, host: str, port: int, read_timeout_s: float = METRICS_READ_TIMEOUT_S,
                   max_connections: int = METRICS_MAX_CONNECTIONS) -> tuple[int, Callable[[], None]]:
        """Start the /metrics endpoint (port 0 = a free one); returns the bound port and a stopper."""
        httpd = MetricsServer(host, port, make_wsgi_app(self.registry), read_timeout_s, max_connections)
        thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
        thread.start()

        def stop() -> None:
            httpd.shutdown()
            httpd.server_close()
            thread.join(timeout=5)

        return httpd.server_address[1], stop


class _MetricsHandler(WSGIRequestHandler):
    def setup(self) -> None:
        self.timeout = self.server.read_timeout_s  # StreamRequestHandler.setup() applies it to the socket
        super().setup()

    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
        """Scrapes and dropped connections are not worth a log line each."""


class MetricsServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most `max_connections` of them, each dropped after `read_timeout_s`
    without a byte. A connection beyond the limit is closed unserved: the accept loop never waits, so
    shutdown() stays prompt."""

    daemon_threads = True

    def __init__(self, host: str, port: int, app, read_timeout_s: float, max_connections: int) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.read_timeout_s = read_timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__((host.strip("[]"), port), _MetricsHandler)
        self.set_app(app)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started to give the slot back
            self._slots.release()
            raise

    def handle_error(self, request, client_address) -> None:
        """A connection that timed out or broke is the client's business, not a traceback on stderr."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
