"""What operators and clients read: Prometheus metrics over HTTP, health, reflection, ListEnvs, GetLoad."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.request

from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from env_server.metrics import METRICS_MAX_CONNECTIONS, ServerMetrics
from env_server.server import ENV_SERVICE
from limen.env.v1 import env_pb2

METRIC_NAMES = (
    "limen_active_sessions", "limen_session_capacity", "limen_draining", "limen_resets_total",
    "limen_steps_total", "limen_reset_latency_seconds_bucket", "limen_step_latency_seconds_bucket",
    "limen_errors_total", "limen_worker_rss_bytes", "limen_worker_restarts_total", "limen_sessions_restored_total",
)


def scrape(port: int) -> dict[str, float]:
    """Every sample of the endpoint, keyed by its full line minus the value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            samples[series] = float(value)
    return samples


async def scrape_once(port: int, ready, timeout_s: float = 30.0) -> dict[str, float]:
    """The samples once `ready(samples)` holds (or at the deadline, for the asserts to say what is missing): the
    server restores a crashed worker's sessions and polls worker memory in the background, later on a loaded machine."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = await asyncio.to_thread(scrape, port)
        if ready(samples) or time.monotonic() > deadline:
            return samples
        await asyncio.sleep(0.1)


async def test_metrics_endpoint_serves_every_documented_series(launch):
    async with launch(metrics_port=0, max_sessions=7) as server:
        first = await server.reset()
        await server.step(first.session_id, 1, "look")
        await server.error(server.step(first.session_id, 9, "look"))
        await server.reset(env="faulty")
        crashed = await server.reset(env="faulty", task_id="goto-003")
        await server.error(server.step(crashed.session_id, 1, "crash"))
        def ready(samples: dict[str, float]) -> bool:
            rss = [v for series, v in samples.items() if series.startswith("limen_worker_rss_bytes")]
            return samples.get("limen_sessions_restored_total", 0) >= 1 and bool(rss) and min(rss) > 0

        samples = await scrape_once(server.running.metrics_port, ready)
        names = {series.partition("{")[0] for series in samples}
        assert set(METRIC_NAMES) <= names
        assert samples['limen_active_sessions{env="toy"}'] == 1
        assert samples["limen_session_capacity"] == 7 and samples["limen_draining"] == 0
        assert samples['limen_resets_total{env="toy"}'] == 1 and samples['limen_steps_total{env="toy"}'] == 1
        assert samples['limen_errors_total{code="INVALID_ARGUMENT",method="Step"}'] == 1
        assert samples['limen_errors_total{code="ABORTED",method="Step"}'] == 1
        assert samples['limen_worker_restarts_total{env="faulty",reason="crashed"}'] == 1
        assert samples["limen_sessions_restored_total"] == 1
        assert all(value > 10e6 for series, value in samples.items() if series.startswith("limen_worker_rss_bytes"))


async def test_health_names_and_reflection(server):
    for service in ("", ENV_SERVICE):
        reply = await server.health.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    stream = reflection_pb2_grpc.ServerReflectionStub(server.channel).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    listed = [s.name async for reply in stream for s in reply.list_services_response.service]
    assert {ENV_SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= set(listed)


async def test_list_envs_describes_each_env_once(server):
    reply = await server.stub.ListEnvs(env_pb2.ListEnvsRequest())
    envs = {env.name: env for env in reply.envs}
    assert set(envs) == {"toy", "faulty"} and reply.server_version
    faulty = envs["faulty"]
    assert faulty.version == f"{faulty.code_version}+{faulty.data_hash[:12]}" and faulty.default_max_turns == 15
    train = next(split for split in faulty.splits if split.name == "train")
    assert (train.num_tasks, train.num_excluded) == (120, 1)
    assert dict(train.tasks_per_category) == {"goto": 40, "fetch": 40, "switch": 40}
    first = await server.reset(env="faulty")
    assert first.version == faulty.version and (first.env, first.split) == ("faulty", "train")


async def test_get_load_reports_sessions_and_workers(server):
    await server.reset()
    await server.reset(env="faulty")
    load = await server.load()
    assert (load.active_sessions, load.capacity, load.draining) == (2, 256, False)
    assert dict(load.sessions_by_env) == {"toy": 1, "faulty": 1}
    assert len(load.workers) == 2 and all(w.rss_bytes > 0 and w.episodes_served == 1 for w in load.workers)
    assert load.worker_rss_bytes == sum(w.rss_bytes for w in load.workers)
    assert load.server_id and load.server_id == (await server.load()).server_id


# ---- the metrics port against idle connections (issue 40) ------------------------------------------------
def half_sent_requests(port: int, count: int) -> list[socket.socket]:
    """`count` connections, each with a request line and no end of headers: the server waits for more."""
    connections = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(count)]
    for connection in connections:
        connection.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    return connections


def connection_threads() -> int:
    """Threads serving an HTTP connection (socketserver.ThreadingMixIn names them after its method)."""
    return sum("process_request_thread" in thread.name for thread in threading.enumerate())


def most_connection_threads_over(seconds: float) -> int:
    most, until = connection_threads(), time.monotonic() + seconds
    while time.monotonic() < until:
        most = max(most, connection_threads())
        time.sleep(0.02)
    return most


async def test_idle_metrics_connections_take_a_bounded_number_of_threads(launch):
    async with launch(metrics_port=0) as server:
        connections = await asyncio.to_thread(half_sent_requests, server.running.metrics_port, 60)
        try:
            # Before the fix each one pinned a thread of the server's process, with no end.
            assert 0 < await asyncio.to_thread(most_connection_threads_over, 1.0) <= METRICS_MAX_CONNECTIONS
        finally:
            for connection in connections:
                connection.close()
        await asyncio.sleep(0.2)   # the server sees them closed and frees their threads
        assert "limen_session_capacity" in await asyncio.to_thread(scrape, server.running.metrics_port)


def test_a_metrics_connection_silent_past_the_read_timeout_is_dropped():
    port, stop = ServerMetrics().serve_http("127.0.0.1", 0, read_timeout_s=0.3)
    try:
        [connection] = half_sent_requests(port, 1)
        started = time.monotonic()
        assert connection.recv(1) == b""   # closed by the server, unanswered
        assert 0.2 < time.monotonic() - started < 3
        assert "limen_session_capacity" in scrape(port)
    finally:
        stop()
