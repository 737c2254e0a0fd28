"""Every env-server setting in one frozen dataclass, plus the parsers for its compact CLI spellings.

The CLI itself lives in `__main__.py`; this module has no I/O.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import yaml

MIB = 1024 * 1024
# The variable the server reads its bearer token from; worker processes do not inherit it.
AUTH_TOKEN_ENV = "LIMEN_AUTH_TOKEN"


def default_worker_count(num_envs: int) -> int:
    """Worker processes per env when not given: the usable cores shared among the envs, at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, num_envs))


def setting(default: Any, help: str, **field_options: Any) -> Any:
    """A config field whose help text the CLI shows (`__main__` derives its flags from these)."""
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"help": help}, **field_options)
    return field(default=default, metadata={"help": help}, **field_options)


@dataclass(frozen=True)
class ServerConfig:
    # ---- what is served -------------------------------------------------------------------------------
    envs: tuple[str, ...] = setting(
        ("toy",), "env names to serve; each registered in env_server.registry or given in entry_points")
    entry_points: Mapping[str, str] = setting(
        {}, "extra envs, name -> 'module:Class', registered at start (an env from outside the package)")
    env_options: Mapping[str, Mapping[str, Any]] = setting(
        {}, "constructor keyword arguments per env: make(name, **env_options[name])")

    # ---- network -----------------------------------------------------------------------------------------
    host: str = setting("127.0.0.1", "bind address; loopback unless another (0.0.0.0) is asked for")
    port: int = setting(50051, "gRPC port; 0 picks a free one")
    metrics_port: int = setting(0, "Prometheus HTTP port; 0 picks a free one (logged), -1 turns metrics off")
    metrics_host: str = setting(
        "127.0.0.1", "bind address of the metrics port: plain HTTP with no auth, so loopback unless a scraper "
        "elsewhere needs it (0.0.0.0), whatever --host is")
    max_message_bytes: int = setting(
        4 * MIB, "gRPC send/receive limit per message; above max_action_bytes so that an oversize action "
        "gets the server's own INVALID_ARGUMENT with a reason, not a transport error")
    keepalive_min_ping_interval_s: float = setting(
        10.0, "client keepalive pings closer together than this count as abuse (clients ping every ~30 s)")
    max_connection_age_s: float = setting(
        0.0, "close connections after this age so that clients re-resolve and find new pods (gRFC A9); 0 = never")
    max_connection_age_grace_s: float = setting(
        0.0, "how long a connection closed for age still serves its calls; set >= the longest episode")

    # ---- sessions ----------------------------------------------------------------------------------------
    max_sessions: int = setting(256, "live episodes held at once; a Reset beyond it gets RESOURCE_EXHAUSTED")
    idle_ttl_s: float = setting(600.0, "a session untouched this long is closed; its id then answers NOT_FOUND")
    finished_grace_s: float = setting(
        60.0, "a finished (terminated/truncated) session nobody closed is released this long after its last "
        "step, which a retry may ask for until then; its id then answers NOT_FOUND")
    max_finished_sessions: int = setting(
        1024, "finished sessions kept for retries at once, beyond max_sessions; past it the oldest are released")
    max_action_bytes: int = setting(16 * 1024, "longest action accepted, in UTF-8 bytes (INVALID_ARGUMENT beyond)")

    # ---- workers -----------------------------------------------------------------------------------------
    workers: int = setting(0, "worker processes per env; 0 = the usable cores shared among the envs")
    workers_by_env: Mapping[str, int] = setting({}, "per-env overrides of workers")
    step_timeout_s: float = setting(
        60.0, "budget of one env step; past it the worker is killed and the session ends DEADLINE_EXCEEDED")
    reset_timeout_s: float = setting(300.0, "budget of one env reset (an ALFWorld reset builds a game)")
    worker_start_timeout_s: float = setting(
        600.0, "budget for a new worker to load its env and describe it (WebShop builds its index)")
    recycle_after_episodes: int = setting(
        1000, "a worker that has served this many episodes takes no more and is replaced; 0 = never")
    worker_rss_limit_mb: float = setting(
        0.0, "a worker above this resident memory takes no new sessions and is replaced; 0 = no limit")
    rss_poll_s: float = setting(5.0, "how often worker memory is read (for metrics and the RSS limit)")

    # ---- shutdown ----------------------------------------------------------------------------------------
    drain_grace_s: float = setting(30.0, "after SIGTERM, how long live episodes may go on before the server stops")
    stop_grace_s: float = setting(5.0, "after draining, how long in-flight calls get to finish")

    # ---- security ----------------------------------------------------------------------------------------
    tls_cert: str | None = setting(None, "PEM server certificate; with tls_key the port speaks TLS only")
    tls_key: str | None = setting(None, "PEM private key of tls_cert")
    tls_client_ca: str | None = setting(
        None, "PEM CA bundle; when set, clients must show a certificate it signed (mutual TLS)")
    auth_token: str | None = setting(
        None, "when set, every EnvService call needs metadata 'authorization: Bearer <token>' (health stays "
        "open); prefer the LIMEN_AUTH_TOKEN env var, which `ps` does not show", repr=False)

    log_level: str = setting("INFO", "logging level")

    def __post_init__(self) -> None:
        # Mappings are frozen too, so a config shared between tasks cannot change under them.
        for name in ("entry_points", "env_options", "workers_by_env"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        self._validate()

    def _validate(self) -> None:
        if not self.envs or len(set(self.envs)) != len(self.envs) or not all(self.envs):
            raise ValueError(f"envs must be distinct non-empty names, got {self.envs!r}")
        for name in ("workers_by_env", "env_options"):
            unknown = set(getattr(self, name)) - set(self.envs)
            if unknown:
                raise ValueError(f"{name} names envs that are not served: {sorted(unknown)}")
        positive = ("max_sessions", "max_action_bytes", "max_message_bytes", "idle_ttl_s", "step_timeout_s",
                    "reset_timeout_s", "worker_start_timeout_s", "rss_poll_s", "keepalive_min_ping_interval_s")
        non_negative = ("workers", "recycle_after_episodes", "worker_rss_limit_mb", "drain_grace_s",
                        "stop_grace_s", "max_connection_age_s", "max_connection_age_grace_s", "finished_grace_s",
                        "max_finished_sessions")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if any(count < 1 for count in self.workers_by_env.values()):
            raise ValueError(f"workers_by_env counts must be >= 1, got {dict(self.workers_by_env)}")
        if not 0 <= self.port <= 65535 or not -1 <= self.metrics_port <= 65535:
            raise ValueError(f"ports out of range: port={self.port}, metrics_port={self.metrics_port}")
        if self.max_message_bytes <= self.max_action_bytes:
            raise ValueError("max_message_bytes must exceed max_action_bytes, or long actions fail in transport")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca (mutual TLS) needs tls_cert and tls_key")
        if self.auth_token is not None and not self.auth_token:
            raise ValueError("auth_token must not be empty")

    def workers_for(self, env: str) -> int:
        return self.workers_by_env.get(env) or self.workers or default_worker_count(len(self.envs))

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


def parse_workers(text: str) -> tuple[int, dict[str, int]]:
    """"2" -> (2, {}); "toy=1,alfworld=2" -> (0, {"toy": 1, "alfworld": 2})."""
    text = text.strip()
    if "=" not in text:
        return _positive_int(text, "--workers"), {}
    counts = {}
    for item in text.split(","):
        name, _, count = item.partition("=")
        if not name.strip():
            raise ValueError(f"--workers: expected NAME=COUNT, got {item!r}")
        counts[name.strip()] = _positive_int(count, f"--workers {name.strip()}")
    return 0, counts


def parse_env_options(items: Iterable[str]) -> dict[str, dict[str, Any]]:
    """["webshop.observation_mode=text", "webshop.num_products=1000"] ->
    {"webshop": {"observation_mode": "text", "num_products": 1000}}; values are YAML scalars."""
    options: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        env, dot, option = key.strip().partition(".")
        if not (sep and dot and env and option.isidentifier()):
            raise ValueError(f"--env-option: expected ENV.KEY=VALUE, got {item!r}")
        value = yaml.safe_load(raw) if raw.strip() else ""
        if isinstance(value, (dict, list)):
            raise ValueError(f"--env-option {key}: expected a scalar, got {raw!r}")
        options.setdefault(env, {})[option] = value
    return options


def parse_entry_points(items: Iterable[str]) -> dict[str, str]:
    """["maze=my_pkg.maze:MazeEnv"] -> {"maze": "my_pkg.maze:MazeEnv"}."""
    entry_points = {}
    for item in items:
        name, _, target = item.partition("=")
        module, colon, cls = target.partition(":")
        if not (name.strip() and module and colon and cls):
            raise ValueError(f"--env-entry-point: expected NAME=module:Class, got {item!r}")
        entry_points[name.strip()] = target.strip()
    return entry_points


def _positive_int(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what}: expected a whole number, got {text!r}") from None
    if value < 1:
        raise ValueError(f"{what}: must be >= 1, got {value}")
    return value
