"""How an env pool talks to its servers: transport, deadlines, retries, placement, TLS and token."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Transport = Literal["stream", "unary"]


@dataclass(frozen=True)
class PoolConfig:
    # "stream": one Episode bidi stream per episode; "unary": Reset/Step/Close with session_id. Stream is
    # the default: about twice the steps/s of unary in benchmarks/wire.py, and the server frees the env
    # as soon as the stream goes away.
    transport: Transport = "stream"
    # Deadlines. A reset may build a game (ALFWorld), so it gets longer than a step.
    reset_timeout_s: float = 120.0
    step_timeout_s: float = 60.0
    query_timeout_s: float = 10.0          # ListEnvs, ListTasks, GetLoad, Close
    episode_timeout_s: float = 4 * 3600.0  # the deadline of a whole Episode stream
    # Attempts of one unary call on its server (the first plus retries on UNAVAILABLE); safe because the
    # server de-duplicates step_index.
    retry_attempts: int = 4
    retry_initial_backoff_s: float = 0.05
    retry_max_backoff_s: float = 2.0
    # How often `open` walks every server (with backoff and a fresh load poll) before NoServerAvailable.
    # Rounds where the only obstacle was full servers do not count, for up to reset_timeout_s.
    placement_rounds: int = 4
    # How many lost sessions one episode survives before it is dropped.
    replay_attempts: int = 3
    load_poll_interval_s: float = 1.0
    resolve_interval_s: float = 30.0
    # How long start() keeps asking DNS when no name resolves yet: a container or pod that was just started (a
    # compose `run` beside its pools, a Kubernetes Job) can ask before the network's resolver knows its peers.
    start_resolve_s: float = 30.0
    allow_mixed_versions: bool = False
    # A server restarted on its address is dialed again within this long (gRPC's own default backs off to 120 s).
    max_reconnect_backoff_s: float = 5.0
    # Keepalive: detects a dead peer on an idle connection. The server must permit pings this often.
    keepalive_time_s: float = 30.0
    keepalive_timeout_s: float = 10.0
    max_message_bytes: int = 32 * 2**20
    auth_token: str | None = field(default=None, repr=False)
    tls_root_cert: str | None = None       # PEM file of the CA that signed the servers' certificates
    # PEM certificate chain and key this client shows to servers that require mutual TLS.
    tls_client_cert: str | None = None
    tls_client_key: str | None = None

    def __post_init__(self) -> None:
        if self.transport not in ("stream", "unary"):
            raise ValueError(f"transport must be 'stream' or 'unary', got {self.transport!r}")
        positive = ("reset_timeout_s", "step_timeout_s", "query_timeout_s", "episode_timeout_s",
                    "load_poll_interval_s", "resolve_interval_s", "start_resolve_s", "keepalive_time_s", "keepalive_timeout_s",
                    "retry_initial_backoff_s", "retry_max_backoff_s", "retry_attempts", "placement_rounds",
                    "max_message_bytes", "max_reconnect_backoff_s")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.replay_attempts < 0:
            raise ValueError(f"replay_attempts must be >= 0, got {self.replay_attempts}")
        if (self.tls_client_cert is None) != (self.tls_client_key is None):
            raise ValueError("tls_client_cert and tls_client_key go together")

    def channel_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.keepalive_time_ms", int(self.keepalive_time_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout_s * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_reconnect_backoff_ms", int(self.max_reconnect_backoff_s * 1000)),
        ]

    def call_metadata(self) -> tuple[tuple[str, str], ...] | None:
        """What every call carries: the bearer token, when there is one."""
        return (("authorization", f"Bearer {self.auth_token}"),) if self.auth_token else None


def backoff_s(config: PoolConfig, attempt: int) -> float:
    """Exponential pause before placement round `attempt` (1, 2, ...)."""
    return min(config.retry_max_backoff_s, config.retry_initial_backoff_s * 2 ** (attempt - 1))
