"""Asyncio client over one or many env servers: discovery, placement by load, deadlines and retries, and
episode replay when a session is lost. Trainers get `Episode` handles and frozen `Transition`s; every
failure is a typed `EnvPoolError`, never a silent default.

    async with EnvPool(["127.0.0.1:50051"]) as pool:
        episode = await pool.open("toy", "train", task_id, seed=0)
        t = await episode.step("go to hall")
        await episode.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import grpc
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from limen.env.v1 import env_pb2, env_pb2_grpc
from trainer_client.discovery import HostLookup, parse_targets, resolve, system_lookup
from trainer_client.env_types import (
    EnvInfo, EnvPoolError, EpisodeDropped, EpisodeOver, InvalidAction, MixedVersions, NoServerAvailable, Phase,
    PoolStats, ReplayMismatch, ServerLoad, ServerStats, SessionLost, StepTimedOut, Transition, Unauthenticated,
    UnknownEnvOrTask, env_info_from_proto, placement_order, status_error, transition_from_proto,
)

log = logging.getLogger(__name__)

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
                    "load_poll_interval_s", "resolve_interval_s", "keepalive_time_s", "keepalive_timeout_s",
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


def backoff_s(config: PoolConfig, attempt: int) -> float:
    """Exponential pause before placement round `attempt` (1, 2, ...)."""
    return min(config.retry_max_backoff_s, config.retry_initial_backoff_s * 2 ** (attempt - 1))


@dataclass(frozen=True)
class EpisodeSpec:
    """What identifies an episode, so that it can be re-created anywhere."""

    env: str
    split: str
    task_id: str
    seed: int
    max_turns: int
    options: Mapping[str, str]
    episode_id: str

    def reset_request(self, attempt: int) -> env_pb2.ResetRequest:
        # Each session gets its own episode id, so a server still holding a lost session of this
        # episode never hands that session back to a replay (Reset is idempotent by episode_id).
        episode_id = self.episode_id if attempt == 0 else f"{self.episode_id}~replay{attempt}"
        return env_pb2.ResetRequest(env=self.env, split=self.split, task_id=self.task_id, seed=self.seed,
                                    episode_id=episode_id, options=dict(self.options), max_turns=self.max_turns)


# ---- servers ------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Server:
    """One server address with its channel and what the pool knows of it."""

    address: str
    channel: grpc.aio.Channel
    stub: env_pb2_grpc.EnvServiceStub
    server_id: str = ""
    envs: dict[str, env_pb2.EnvInfo] = field(default_factory=dict)
    load: env_pb2.GetLoadResponse | None = None   # None: no answer at the last poll
    failure: grpc.StatusCode | None = None        # the last poll's error code
    problem: str = "not polled yet"
    # Sessions the last poll may not count: resets still in flight, and resets answered since it was sent.
    # Both only ever over-estimate the load (the server may count some already), never under-estimate.
    resetting: int = 0
    opened_since_poll: int = 0
    refused: bool = False                         # refused a session since the last poll
    live: int = 0                                 # this pool's sessions on it
    retired: bool = False                         # no target names it any more: no new sessions

    def load_view(self) -> ServerLoad | None:
        if self.load is None or self.retired or self.refused:
            return None
        return ServerLoad(self.address, self.estimated_active, self.load.capacity, self.load.draining)

    @property
    def estimated_active(self) -> int:
        return self.load.active_sessions + self.resetting + self.opened_since_poll

    def describe(self) -> str:
        if self.retired:
            return f"{self.address}: no longer resolved"
        if self.load is None or self.refused:
            return f"{self.address}: {self.problem}"
        if self.load.draining:
            return f"{self.address}: draining"
        return f"{self.address}: {self.estimated_active}/{self.load.capacity} sessions"


# ---- sessions: the two transports behind one interface -------------------------------------------------


class _UnarySession:
    """Reset/Step/Close calls carrying session_id; steps are retried in place on UNAVAILABLE."""

    def __init__(self, pool: EnvPool, server: _Server) -> None:
        self.pool, self.server = pool, server
        self.session_id = ""

    async def reset(self, request: env_pb2.ResetRequest) -> env_pb2.Transition:
        # No retry in place: UNAVAILABLE at reset usually means draining, so placement moves on instead.
        first = await self.pool._call(self.server, "Reset", request, phase="reset", retry=False)
        self.session_id = first.session_id
        return first

    async def step(self, step_index: int, action: bytes) -> env_pb2.Transition:
        request = env_pb2.StepRequest(session_id=self.session_id, step_index=step_index, action=action)
        return await self.pool._call(self.server, "Step", request, phase="step")

    async def close(self) -> None:
        if not self.session_id:   # the reset never answered: there is no id to close
            return
        # Best effort: a session the server already lost or reaped has nothing left to free.
        with contextlib.suppress(EnvPoolError):
            await self.pool._call(self.server, "Close", env_pb2.CloseRequest(session_id=self.session_id),
                                  phase="query", retry=False)


class _StreamSession:
    """One Episode stream: the stream is the session, so it cannot wander off its server."""

    def __init__(self, pool: EnvPool, server: _Server) -> None:
        self.pool, self.server = pool, server
        self.call: grpc.aio.StreamStreamCall | None = None

    async def reset(self, request: env_pb2.ResetRequest) -> env_pb2.Transition:
        self.call = self.server.stub.Episode(timeout=self.pool.config.episode_timeout_s,
                                             metadata=self.pool._metadata)
        return await self._exchange(env_pb2.EpisodeRequest(reset=request), "reset")

    async def step(self, step_index: int, action: bytes) -> env_pb2.Transition:
        request = env_pb2.EpisodeRequest(step=env_pb2.StepRequest(step_index=step_index, action=action))
        return await self._exchange(request, "step")

    async def _exchange(self, request: env_pb2.EpisodeRequest, phase: Phase) -> env_pb2.Transition:
        config = self.pool.config
        timeout = config.reset_timeout_s if phase == "reset" else config.step_timeout_s
        if self.call.done():
            # Any error status ends a stream, even one that left the episode intact (a refused action).
            raise SessionLost(f"{self.server.address}: the episode stream has ended", self.server.address)
        try:
            async with asyncio.timeout(timeout):
                await self.call.write(request)
                reply = await self.call.read()
        except asyncio.CancelledError:
            # A reply may still be on its way; it must never be read as the answer to a later request.
            self.call.cancel()
            raise
        except TimeoutError:
            self.call.cancel()
            raise StepTimedOut(f"{self.server.address}: no answer to {phase} within {timeout:g}s",
                               self.server.address) from None
        except grpc.aio.AioRpcError as error:
            raise status_error(error.code(), error.details(), phase, self.server.address) from error
        except asyncio.InvalidStateError:
            # The stream had already finished (e.g. the server dropped it): its status says why.
            reply = grpc.aio.EOF
        if reply is grpc.aio.EOF:
            code, details = await self.call.code(), await self.call.details()
            if code is grpc.StatusCode.OK:
                raise SessionLost(f"{self.server.address}: the server ended the episode stream", self.server.address)
            raise status_error(code, details, phase, self.server.address)
        return reply

    async def close(self) -> None:
        if self.call is None or self.call.done():
            return
        try:
            # Half-close and let the server end the stream, so it frees the env before we move on.
            async with asyncio.timeout(self.pool.config.query_timeout_s):
                await self.call.done_writing()
                while await self.call.read() is not grpc.aio.EOF:
                    pass
        except (TimeoutError, grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass
        finally:
            self.call.cancel()   # a no-op once the stream has finished


_Session = _UnarySession | _StreamSession
_SESSION_TYPES: dict[str, type[_UnarySession] | type[_StreamSession]] = {
    "unary": _UnarySession, "stream": _StreamSession,
}


# ---- episodes -----------------------------------------------------------------------------------------


class Episode:
    """One episode: its recorded actions and transitions, and the session that currently holds it.

    When the session is lost (recoverable errors), the episode is re-created on another server with the
    same task and seed, its actions are replayed, and every replayed transition must equal the recorded
    one; then play continues as if nothing happened. Past `replay_attempts`, it raises EpisodeDropped.
    """

    def __init__(self, pool: EnvPool, spec: EpisodeSpec) -> None:
        self.spec = spec
        self._pool = pool
        self._session: _Session | None = None
        self._sessions_opened = 0
        self._lost_on: frozenset[str] = frozenset()   # where the last session was lost: placed last
        self._actions: list[str] = []
        self._transitions: list[Transition] = []
        self._lock = asyncio.Lock()
        self._ended: str = ""   # why no further step is allowed: "closed" or "dropped"

    @property
    def episode_id(self) -> str:
        return self.spec.episode_id

    @property
    def first(self) -> Transition:
        return self._transitions[0]

    @property
    def last(self) -> Transition:
        return self._transitions[-1]

    @property
    def transitions(self) -> tuple[Transition, ...]:
        return tuple(self._transitions)

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(self._actions)

    @property
    def done(self) -> bool:
        return bool(self._transitions) and self.last.done

    @property
    def server(self) -> str | None:
        """The address holding the session now (None after close or drop)."""
        return self._session.server.address if self._session else None

    @property
    def replays(self) -> int:
        """How many times this episode was re-created after losing its session."""
        return max(0, self._sessions_opened - 1)

    async def step(self, action: str) -> Transition:
        try:
            encoded = action.encode("utf-8")
        except UnicodeEncodeError as error:
            raise InvalidAction(f"action is not encodable as UTF-8: {error}") from error
        async with self._lock:
            if self._ended:
                raise EpisodeOver(f"episode {self.episode_id} is {self._ended}")
            if self.done:
                raise EpisodeOver(f"episode {self.episode_id} ended at step {self.last.step_index}")
            step_index = len(self._actions) + 1
            try:
                reply = await self._with_recovery((step_index, encoded))
            except asyncio.CancelledError:
                # The step may or may not have been applied. Leave the session: the next step goes to a
                # fresh one rebuilt from the record, which is certain.
                self._abandon()
                raise
            transition = self._pool._accept(reply, self)
            self._actions.append(action)
            self._transitions.append(transition)
            return transition

    async def close(self) -> None:
        """Free the server session. Safe to call twice; never raises for infrastructure trouble."""
        if not self._ended:
            self._ended = "closed"
        session, self._session = self._session, None
        if session is not None:
            await self._pool._release(session)
        self._pool._forget(self)

    async def __aenter__(self) -> Episode:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    # ---- the replay machinery ---------------------------------------------------------------------------
    async def _start(self) -> None:
        async with self._lock:
            reply = await self._with_recovery(None)
            self._transitions.append(self._pool._accept(reply, self))

    async def _with_recovery(self, step: tuple[int, bytes] | None) -> env_pb2.Transition:
        """Apply `step` (step_index, action) to the episode, or with None only open its first session and
        return the reset. A lost session is rebuilt by replay and the step tried again."""
        failures = 0
        while True:
            try:
                first = await self._establish() if self._session is None else None
                return first if step is None else await self._session.step(*step)
            except EnvPoolError as error:
                if error.recoverable:
                    self._abandon(error)
                if error.recoverable and failures < self._pool.config.replay_attempts:
                    failures += 1
                    continue
                # A started episode that cannot be rebuilt is dropped whatever the reason; a live
                # session's own refusal (InvalidAction, EpisodeOver) is the caller's to handle.
                if error.recoverable or (self._session is None and self._transitions):
                    raise self._drop(error, failures) from error
                raise

    async def _establish(self) -> env_pb2.Transition:
        """Open a session and bring it to where the recorded episode is, checking every transition;
        returns the new session's reset."""
        if self._ended:   # closed by another task while this one was recovering
            raise EpisodeOver(f"episode {self.episode_id} is {self._ended}")
        attempt = self._sessions_opened
        session, first = await self._pool._open_session(self.spec.reset_request(attempt), self._lost_on)
        self._sessions_opened += 1
        try:
            self._check_replayed(0, first, session)
            for step_index, action in enumerate(self._actions, 1):
                self._check_replayed(step_index, await session.step(step_index, action.encode()), session)
        except BaseException as error:
            self._pool._abandon(session, lost=isinstance(error, EnvPoolError) and error.recoverable)
            raise
        self._session = session
        if attempt:
            self._pool._count("replays")
        return first

    def _check_replayed(self, step_index: int, reply: env_pb2.Transition, session: _Session) -> None:
        if step_index >= len(self._transitions):
            return
        recorded = self._transitions[step_index]
        replayed = transition_from_proto(reply, episode_id=self.episode_id, server=session.server.address)
        if not recorded.same_outcome(replayed):
            raise ReplayMismatch(
                f"replay of episode {self.episode_id} on {session.server.address} diverged at step "
                f"{step_index}: recorded {recorded.observation!r}, replayed {replayed.observation!r}"
            )

    def _abandon(self, error: EnvPoolError | None = None) -> None:
        """Leave the current session (if any). After an error, steer the next placement away from it."""
        if error is not None and error.server:
            self._lost_on = frozenset({error.server})
        session, self._session = self._session, None
        if session is not None:
            self._pool._abandon(session, lost=error is not None)

    def _drop(self, cause: EnvPoolError, failures: int) -> EpisodeDropped:
        self._ended = "dropped"
        self._pool._count("dropped")
        self._pool._forget(self)
        return EpisodeDropped(
            f"episode {self.episode_id} ({self.spec.env}/{self.spec.split}/{self.spec.task_id}, seed "
            f"{self.spec.seed}) dropped after {failures} replay(s) at step {len(self._actions)}: {cause}"
        )


# ---- the pool -----------------------------------------------------------------------------------------


class EnvPool:
    """Sessions over every server the targets name, placed by load and pinned where they live.

    `targets`: "host:port" / "dns:///name:port" entries (a list, or one comma-separated string).
    `lookup`: resolves dns:/// names; tests pass their own table. Other keywords override `config`.
    """

    def __init__(self, targets: str | Iterable[str], config: PoolConfig | None = None, *,
                 lookup: HostLookup = system_lookup, **overrides) -> None:
        self.config = dataclasses.replace(config or PoolConfig(), **overrides)
        self._targets = parse_targets(targets)
        self._lookup = lookup
        self._servers: dict[str, _Server] = {}
        self._pinned_versions: dict[str, str] = {}
        self._counts: Counter[str] = Counter()
        self._server_counts: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self._episodes: set[Episode] = set()
        self._loops: list[asyncio.Task] = []
        self._chores: set[asyncio.Task] = set()   # closes of abandoned sessions, run in the background
        token = self.config.auth_token
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._credentials = None
        if self.config.tls_root_cert or self.config.tls_client_cert:
            self._credentials = grpc.ssl_channel_credentials(*(
                Path(pem).read_bytes() if pem else None
                for pem in (self.config.tls_root_cert, self.config.tls_client_key, self.config.tls_client_cert)))

    # ---- life cycle ---------------------------------------------------------------------------------
    async def __aenter__(self) -> EnvPool:
        try:
            await self.start()
        except BaseException:
            await self.aclose()   # the channels opened so far
            raise
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Resolve the targets and poll every server once; then keep both fresh in the background."""
        await self._refresh_servers()
        if not self._servers:
            raise NoServerAvailable(f"no address resolves from {', '.join(map(str, self._targets))}")
        refused = [s.describe() for s in self._servers.values() if s.failure is grpc.StatusCode.UNAUTHENTICATED]
        if refused:
            raise Unauthenticated("servers refuse our credentials: " + "; ".join(refused))
        self._check_versions_agree()
        self._loops.append(asyncio.create_task(self._every(self.config.load_poll_interval_s, self._poll_all)))
        if any(target.dynamic for target in self._targets):
            self._loops.append(asyncio.create_task(self._every(self.config.resolve_interval_s,
                                                               self._refresh_servers)))

    async def aclose(self) -> None:
        for loop_task in self._loops:
            loop_task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        await asyncio.gather(*(episode.close() for episode in list(self._episodes)), return_exceptions=True)
        await asyncio.gather(*self._chores, return_exceptions=True)
        await asyncio.gather(*(server.channel.close() for server in self._servers.values()))
        self._servers.clear()

    # ---- what a trainer calls -----------------------------------------------------------------------
    async def open(self, env: str, split: str, task_id: str, *, seed: int = 0, max_turns: int = 0,
                   options: Mapping[str, str] | None = None, episode_id: str | None = None) -> Episode:
        """Start an episode on the least-loaded server that hosts `env`; `episode.first` is the reset."""
        if not self._loops:
            raise RuntimeError("the pool is not started: use `async with EnvPool(...)` or await start()")
        if max_turns < 0:
            raise ValueError(f"max_turns must be >= 0, got {max_turns}")
        spec = EpisodeSpec(env, split, task_id, seed, max_turns, dict(options or {}),
                           episode_id or uuid.uuid4().hex)
        episode = Episode(self, spec)
        await episode._start()
        self._episodes.add(episode)
        return episode

    async def list_envs(self) -> dict[str, EnvInfo]:
        """Every env the reachable servers host (in the version this run uses)."""
        await self._poll_all()
        hosts: defaultdict[str, list[_Server]] = defaultdict(list)
        for server in self._reachable():
            for name, info in server.envs.items():
                if self._version_allowed(name, info.version):
                    hosts[name].append(server)
        if not hosts:
            raise NoServerAvailable("no server answers: " + self._describe_servers())
        return {name: env_info_from_proto(servers[0].envs[name], (s.address for s in servers))
                for name, servers in sorted(hosts.items())}

    async def list_tasks(self, env: str, split: str) -> list[str]:
        """The playable task ids of one split, in the server's stable order (every page)."""
        failures = []
        for server in self._hosts(env):
            try:
                return await self._all_task_ids(server, env, split)
            except (NoServerAvailable, SessionLost, StepTimedOut) as error:
                failures.append(str(error))
        raise NoServerAvailable(f"no server answered ListTasks for {env!r}: "
                                + "; ".join(failures or [self._describe_servers()]))

    @property
    def stats(self) -> PoolStats:
        by_server = {address: ServerStats(**counts) for address, counts in sorted(self._server_counts.items())}
        return PoolStats(**self._counts, by_server=by_server)

    @property
    def versions(self) -> dict[str, str]:
        """env -> the version this run is pinned to (the first one seen)."""
        return dict(self._pinned_versions)

    @property
    def servers(self) -> dict[str, str]:
        """address -> its state in words, for logs and error messages."""
        return {address: server.describe() for address, server in sorted(self._servers.items())}

    # ---- placement ----------------------------------------------------------------------------------
    async def _open_session(self, request: env_pb2.ResetRequest,
                            avoid: frozenset[str]) -> tuple[_Session, env_pb2.Transition]:
        # Full servers are back-pressure, not failure: while some host is up and merely full, the wait for a
        # slot (up to reset_timeout_s) uses up no placement round, so a burst of episodes queues instead of
        # dropping the ones that found no room.
        deadline = asyncio.get_running_loop().time() + self.config.reset_timeout_s
        failed_rounds = attempt = 0
        while failed_rounds < self.config.placement_rounds:
            if attempt:
                await asyncio.sleep(backoff_s(self.config, attempt))
                await self._poll_all()
            attempt += 1
            for server in self._placement(request.env, avoid):
                session = _SESSION_TYPES[self.config.transport](self, server)
                # Reserve the slot before awaiting, so that concurrent opens spread instead of all
                # picking the server that looked emptiest before any of them landed.
                server.resetting += 1
                try:
                    first = await session.reset(request)
                except BaseException as error:
                    await session.close()
                    if not isinstance(error, NoServerAvailable):
                        raise
                    server.refused, server.problem = True, str(error)   # full or draining: try the next
                    continue
                finally:
                    server.resetting -= 1
                server.opened_since_poll += 1
                server.live += 1
                self._count("opened", server)
                return session, first
            if not (self._only_full(request.env) and asyncio.get_running_loop().time() < deadline):
                failed_rounds += 1
        raise NoServerAvailable(f"no server took a {request.env!r} session in {self.config.placement_rounds} "
                                f"rounds: {self._describe_servers()}")

    def _only_full(self, env: str) -> bool:
        """Some server hosting `env` answers and is not draining: it refused for want of room only."""
        return any(not server.load.draining for server in self._hosts(env))

    def _placement(self, env: str, avoid: frozenset[str]) -> list[_Server]:
        hosts = self._hosts(env)
        loads = [view for view in (server.load_view() for server in hosts) if view is not None]
        return [self._servers[address] for address in placement_order(loads, avoid)]

    def _hosts(self, env: str) -> list[_Server]:
        """Reachable, current servers hosting `env` in an allowed version. Raises when every server
        answered and none hosts it: waiting would not help."""
        reachable = self._reachable()
        hosts = [s for s in reachable if env in s.envs and self._version_allowed(env, s.envs[env].version)]
        if not hosts and reachable and len(reachable) == sum(not s.retired for s in self._servers.values()):
            hosted = sorted({name for s in reachable for name in s.envs})
            raise UnknownEnvOrTask(f"no server hosts env {env!r} (in version "
                                   f"{self._pinned_versions.get(env, 'any')}); hosted: {hosted}")
        return hosts

    def _reachable(self) -> list[_Server]:
        return [s for s in self._servers.values() if s.load is not None and not s.retired]

    def _describe_servers(self) -> str:
        return "; ".join(self.servers.values()) or "no servers"

    # ---- versions -----------------------------------------------------------------------------------
    def _version_allowed(self, env: str, version: str) -> bool:
        return self.config.allow_mixed_versions or self._pinned_versions.setdefault(env, version) == version

    def _check_versions_agree(self) -> None:
        seen: defaultdict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        for server in self._reachable():
            for name, info in server.envs.items():
                seen[name][info.version].append(server.address)
        mixed = {name: dict(by_version) for name, by_version in seen.items() if len(by_version) > 1}
        if mixed and not self.config.allow_mixed_versions:
            raise MixedVersions(f"servers disagree on env versions {mixed}; pass allow_mixed_versions=True "
                                "to train on a mix")

    def _accept(self, reply: env_pb2.Transition, episode: Episode) -> Transition:
        """A reply as the trainer sees it, after the version check that keeps one run on one version."""
        server = episode.server or ""
        if not self._version_allowed(reply.env or episode.spec.env, reply.version):
            raise MixedVersions(f"{server} answered {episode.spec.env!r} in version {reply.version!r}, but "
                                f"this run uses {self._pinned_versions[episode.spec.env]!r}")
        if reply.step_index:
            self._count("steps", episode._session.server)
        return transition_from_proto(reply, episode_id=episode.episode_id, server=server)

    # ---- calls ----------------------------------------------------------------------------------------
    async def _call(self, server: _Server, method: str, request, *, phase: Phase, retry: bool = True):
        """One unary call with its deadline; retried with jittered backoff on UNAVAILABLE when `retry`."""
        timeouts = {"reset": self.config.reset_timeout_s, "step": self.config.step_timeout_s,
                    "query": self.config.query_timeout_s}
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.config.retry_attempts if retry else 1),
            wait=wait_exponential_jitter(initial=self.config.retry_initial_backoff_s,
                                         max=self.config.retry_max_backoff_s),
            retry=retry_if_exception(_is_unavailable), before_sleep=self._count_retry, reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await getattr(server.stub, method)(request, timeout=timeouts[phase],
                                                              metadata=self._metadata)
        except grpc.aio.AioRpcError as error:
            raise status_error(error.code(), error.details(), phase, server.address) from error

    async def _all_task_ids(self, server: _Server, env: str, split: str) -> list[str]:
        task_ids, token = [], ""
        while True:
            request = env_pb2.ListTasksRequest(env=env, split=split, page_size=0, page_token=token)
            page = await self._call(server, "ListTasks", request, phase="query")
            task_ids.extend(page.task_ids)
            token = page.next_page_token
            if not token:
                return task_ids

    # ---- bookkeeping ----------------------------------------------------------------------------------
    def _count(self, name: str, server: _Server | None = None) -> None:
        self._counts[name] += 1
        if server is not None:
            self._server_counts[server.address][name] += 1

    def _count_retry(self, retry_state: RetryCallState) -> None:
        self._count("retries")

    def _forget(self, episode: Episode) -> None:
        self._episodes.discard(episode)

    async def _release(self, session: _Session) -> None:
        session.server.live -= 1
        self._count("closed")
        await session.close()

    def _abandon(self, session: _Session, lost: bool = False) -> None:
        """Give a session up without waiting: its close runs in the background."""
        session.server.live -= 1
        if lost:
            self._count("lost", session.server)
        chore = asyncio.create_task(_quietly(session.close()))
        self._chores.add(chore)
        chore.add_done_callback(self._chores.discard)

    # ---- background: loads and discovery ----------------------------------------------------------------
    @staticmethod
    async def _every(interval_s: float, job: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await job()
            except Exception:   # a monitor that stops silently would freeze placement; log and go on
                log.exception("env pool background job failed")

    async def _refresh_servers(self) -> None:
        addresses = await resolve(self._targets, self._lookup)
        fresh = [self._add_server(address) for address in addresses if address not in self._servers]
        for address, server in self._servers.items():
            server.retired = address not in addresses
        await asyncio.gather(*(self._poll(server) for server in fresh))
        await self._remove_idle_retired()

    def _add_server(self, address: str) -> _Server:
        options = self.config.channel_options()
        if self._credentials is None:
            channel = grpc.aio.insecure_channel(address, options=options)
        else:
            channel = grpc.aio.secure_channel(address, self._credentials, options=options)
        server = _Server(address, channel, env_pb2_grpc.EnvServiceStub(channel))
        self._servers[address] = server
        return server

    async def _remove_idle_retired(self) -> None:
        idle = [s for s in self._servers.values() if s.retired and s.live <= 0]
        for server in idle:
            del self._servers[server.address]
        await asyncio.gather(*(server.channel.close() for server in idle))

    async def _poll_all(self) -> None:
        await asyncio.gather(*(self._poll(server) for server in list(self._servers.values())))
        await self._remove_idle_retired()

    async def _poll(self, server: _Server) -> None:
        opened_before = server.opened_since_poll
        timeout, metadata = self.config.query_timeout_s, self._metadata
        try:
            load = await server.stub.GetLoad(env_pb2.GetLoadRequest(), timeout=timeout, metadata=metadata)
            if load.server_id != server.server_id or not server.envs:
                # A new server behind this address (a restarted pod) may host other envs or versions.
                listing = await server.stub.ListEnvs(env_pb2.ListEnvsRequest(), timeout=timeout, metadata=metadata)
                server.envs = {info.name: info for info in listing.envs}
        except grpc.aio.AioRpcError as error:
            server.load, server.failure = None, error.code()
            server.problem = f"unreachable: {error.code().name}: {error.details()}"
            return
        server.server_id, server.load, server.failure = load.server_id, load, None
        # Sessions opened while the poll was in flight are not in its count yet; keep those.
        server.opened_since_poll = max(0, server.opened_since_poll - opened_before)
        server.refused, server.problem = False, ""


async def _quietly(closing: Awaitable[None]) -> None:
    # Closing a session we already gave up on is best effort: its server may be gone with it.
    with contextlib.suppress(Exception):
        await closing


def _is_unavailable(error: BaseException) -> bool:
    return isinstance(error, grpc.aio.AioRpcError) and error.code() is grpc.StatusCode.UNAVAILABLE
