"""The grpc.aio env server: EnvService, grpc.health.v1 and reflection on one port; Prometheus metrics
over HTTP; optional TLS and bearer token; SIGTERM drain. `serve()` runs one in-process (tests,
benchmarks), `run()` is the process's life from start to exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

import env_server
from env_server.backend import EnvBackend, open_backend
from env_server.config import ServerConfig
from env_server.metrics import ServerMetrics
from env_server.service import EnvService
from limen.env.v1 import env_pb2, env_pb2_grpc

log = logging.getLogger("limen.env_server")

ENV_SERVICE = env_pb2.DESCRIPTOR.services_by_name["EnvService"].full_name  # "limen.env.v1.EnvService"
LIVENESS_SERVICE = ""                # SERVING while the process runs
READINESS_SERVICE = ENV_SERVICE      # SERVING while a new session would be accepted
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# The server pings quiet clients this often, so a vanished trainer's episode streams end and free slots.
SERVER_PING_INTERVAL_MS = 60_000
SERVER_PING_TIMEOUT_MS = 20_000


def grpc_options(config: ServerConfig) -> list[tuple[str, int]]:
    options = [
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.so_reuseport", 0),  # port 0 must give a port of our own, never one shared with a stale server
        ("grpc.keepalive_time_ms", SERVER_PING_INTERVAL_MS),
        ("grpc.keepalive_timeout_ms", SERVER_PING_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        # GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS: its string drops the "recv". Pings closer than
        # this are strikes, and two strikes end the connection with GOAWAY "too_many_pings".
        ("grpc.http2.min_ping_interval_without_data_ms", int(config.keepalive_min_ping_interval_s * 1000)),
    ]
    if config.max_connection_age_s:
        options += [("grpc.max_connection_age_ms", int(config.max_connection_age_s * 1000)),
                    ("grpc.max_connection_age_grace_ms", int(config.max_connection_age_grace_s * 1000))]
    return options


def server_credentials(config: ServerConfig) -> grpc.ServerCredentials:
    client_ca = Path(config.tls_client_ca).read_bytes() if config.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes())],
        root_certificates=client_ca, require_client_auth=client_ca is not None)


def server_version() -> str:
    """The package version, plus the git revision when the code runs from a checkout."""
    try:
        revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(env_server.__file__).parent,
                                  capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        revision = ""
    return f"{env_server.__version__}+g{revision}" if revision else env_server.__version__


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Every EnvService call must carry `authorization: Bearer <token>`; health and reflection stay open
    (Kubernetes probes cannot send metadata)."""

    def __init__(self, token: str, metrics: ServerMetrics) -> None:
        self._expected = f"Bearer {token}".encode()
        self._metrics = metrics

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(f"/{ENV_SERVICE}/"):
            return handler
        sent = authorization_values(handler_call_details.invocation_metadata)
        if len(sent) == 1 and hmac.compare_digest(sent[0].encode(), self._expected):
            return handler
        self._metrics.errors.labels(handler_call_details.method.rsplit("/", 1)[-1], "UNAUTHENTICATED").inc()
        # Two headers are refused rather than one picked: proxies and clients disagree on which one counts.
        why = (f"{len(sent)} 'authorization' metadata entries: send exactly one" if len(sent) > 1
               else "missing or wrong bearer token")
        return _rejecting(handler, f"{why}: send metadata 'authorization: Bearer <token>'")


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):
    """A unary EnvService request that does not parse (corrupt wire format, bad UTF-8 in a string field)
    gets INVALID_ARGUMENT with the parser's reason, where gRPC alone answers UNKNOWN. An Episode stream's
    messages are parsed inside the servicer, which maps DecodeError itself."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if (handler is None or handler.request_streaming or handler.response_streaming
                or not handler_call_details.method.startswith(f"/{ENV_SERVICE}/")):
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        parse, behavior = handler.request_deserializer, handler.unary_unary

        def parse_leniently(raw: bytes):
            try:
                return parse(raw)
            except DecodeError as error:
                return _Malformed(f"the {method} request does not parse: {error}")

        async def answer(request, context: grpc.aio.ServicerContext):
            if isinstance(request, _Malformed):
                self._metrics.errors.labels(method, "INVALID_ARGUMENT").inc()
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
            return await behavior(request, context)

        return grpc.unary_unary_rpc_method_handler(answer, request_deserializer=parse_leniently,
                                                   response_serializer=handler.response_serializer)


@dataclass(frozen=True)
class _Malformed:
    reason: str


def authorization_values(metadata) -> list[str]:
    """Every value a call's metadata gives the `authorization` key (gRPC keys are lower case)."""
    return [value for key, value in metadata or () if key == "authorization"]


def _rejecting(handler: grpc.RpcMethodHandler, details: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that answers UNAUTHENTICATED with `details`."""
    async def reject(request_or_iterator, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, details)

    factory = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[handler.request_streaming, handler.response_streaming]
    return factory(reject, request_deserializer=handler.request_deserializer,
                   response_serializer=handler.response_serializer)


@dataclass
class RunningServer:
    """A started server. `address` is where a client on this machine connects ("127.0.0.1:<port>")."""

    config: ServerConfig
    address: str
    port: int
    metrics_port: int | None   # None when metrics are off
    version: str               # ListEnvs.server_version
    backend: EnvBackend
    server: grpc.aio.Server

    @property
    def server_id(self) -> str:
        return self.backend.server_id

    async def drain(self) -> None:
        """Not ready, no new sessions (UNAVAILABLE); live episodes go on for up to drain_grace_s; then stop."""
        self.backend.start_draining()
        log.info("draining: %d live episodes, waiting up to %g s", self.backend.table.live_count(),
                 self.config.drain_grace_s)
        if not await self.backend.wait_drained(self.config.drain_grace_s):
            log.warning("drain grace over with %d episodes still live; stopping", self.backend.table.live_count())
        await self.server.stop(self.config.stop_grace_s)


@asynccontextmanager
async def serve(config: ServerConfig) -> AsyncIterator[RunningServer]:
    """Start workers, the gRPC server and the metrics endpoint; stop them all on exit."""
    metrics = ServerMetrics()
    version = server_version()
    async with open_backend(config, metrics) as backend:
        # The token check goes first: an unauthenticated caller learns nothing, not even a parse error.
        interceptors = [BearerTokenInterceptor(config.auth_token, metrics)] if config.auth_token else []
        interceptors.append(MalformedRequestInterceptor(metrics))
        server = grpc.aio.server(options=grpc_options(config), interceptors=interceptors)
        env_pb2_grpc.add_EnvServiceServicer_to_server(EnvService(backend, metrics, version), server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            (ENV_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        bind = _host_port(config.host, config.port)
        port = (server.add_secure_port(bind, server_credentials(config)) if config.tls
                else server.add_insecure_port(bind))
        if port == 0:
            raise OSError(f"could not bind {bind}")
        await server.start()
        readiness = asyncio.ensure_future(_follow_readiness(backend, health_servicer))
        try:
            with contextlib.ExitStack() as on_exit:
                metrics_port = None
                if config.metrics_port >= 0:
                    # Not config.host: plain HTTP without auth, it stays on loopback unless asked (metrics_host).
                    metrics_port, stop_metrics = metrics.serve_http(config.metrics_host, config.metrics_port)
                    on_exit.callback(stop_metrics)
                yield RunningServer(config, _host_port(_connect_host(config.host), port), port, metrics_port,
                                    version, backend, server)
        finally:
            readiness.cancel()
            await server.stop(None)


async def run(config: ServerConfig) -> int:
    """Serve until SIGTERM or SIGINT, then drain and return the exit code."""
    loop = asyncio.get_running_loop()
    async with serve(config) as running:
        workers = ",".join(f"{env}={config.workers_for(env)}" for env in config.envs)
        log.info("limen env server %s listening on %s (envs %s; workers %s; metrics %s; tls %s; auth %s; "
                 "server_id %s)", running.version, _host_port(config.host, running.port), ",".join(config.envs),
                 workers, _host_port(config.metrics_host, running.metrics_port) if running.metrics_port is not None
                 else "off",
                 "mutual" if config.tls_client_ca else "on" if config.tls else "off",
                 "bearer" if config.auth_token else "off", running.server_id)
        if not _is_loopback(config.host) and not (config.tls or config.auth_token):
            log.warning("serving %s with neither TLS nor a bearer token: anyone who reaches this port can run "
                        "episodes (see --tls-cert and LIMEN_AUTH_TOKEN)", config.host)
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        log.info("signal received")
        await running.drain()
    log.info("stopped")
    return 0


async def _follow_readiness(backend: EnvBackend, health_servicer: health.aio.HealthServicer) -> None:
    while True:
        await health_servicer.set(READINESS_SERVICE, SERVING if backend.ready else NOT_SERVING)
        await backend.wait_change()


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name other than localhost
        return False


def _connect_host(bind_host: str) -> str:
    return "127.0.0.1" if bind_host in ("", "0.0.0.0", "::", "[::]") else bind_host


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
