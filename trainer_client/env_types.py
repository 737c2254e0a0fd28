"""What the env pool hands a trainer: frozen transitions, env descriptions, stats, typed errors, and the
pure rules behind them (status code -> error, load -> placement order). No I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import grpc

from limen.env.v1 import env_pb2

# ---- errors -------------------------------------------------------------------------------------------


class EnvPoolError(Exception):
    """Base of every pool error. `recoverable`: replaying the episode on a fresh session may save it.
    `server`: the address the error came from, when one did."""

    recoverable: ClassVar[bool] = False

    def __init__(self, message: str, server: str = "") -> None:
        super().__init__(message)
        self.server = server


class NoServerAvailable(EnvPoolError):
    """No server can take a new session: none resolves, answers, hosts the env, or has room."""


class UnknownEnvOrTask(EnvPoolError):
    """The env, split or task does not exist, or the task cannot be played (a request bug)."""


class EpisodeOver(EnvPoolError):
    """A step after the episode terminated or was truncated (a caller bug)."""


class InvalidAction(EnvPoolError):
    """The server refused the action bytes (too long, not UTF-8); the episode itself is untouched."""


class Unauthenticated(EnvPoolError):
    """Missing or wrong bearer token, or a TLS identity the server refuses."""


class MixedVersions(EnvPoolError):
    """Servers run different versions of one env and the pool was told not to mix them."""


class ServerError(EnvPoolError):
    """A status code the contract does not document (e.g. UNIMPLEMENTED): a server bug, not a lost session."""


class SessionLost(EnvPoolError):
    """The server no longer holds the session: it died, drained, crashed a worker, or reaped the session."""

    recoverable = True


class StepTimedOut(EnvPoolError):
    """A reset or step passed its deadline (the client's, or the env's own time budget on the server)."""

    recoverable = True


class ReplayMismatch(EnvPoolError):
    """A replayed episode diverged from what was recorded, so it cannot be continued faithfully."""


class EpisodeDropped(EnvPoolError):
    """The episode is lost for good; its `__cause__` says why. Count it; never score it as reward 0."""


Phase = Literal["reset", "step", "query"]

# Codes that mean "this session (or call) is gone, the episode may live on elsewhere". Unknown and
# INTERNAL are what a stream broken by a dying peer often reports.
_LOST_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL,
})
# Codes that mean "the request names something that does not exist or cannot be served as asked".
_REQUEST_CODES = frozenset({
    grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
})


def status_error(code: grpc.StatusCode, details: str | None, phase: Phase, server: str) -> EnvPoolError:
    """The typed error for a gRPC status, following the table in env.proto. `phase` matters because the
    same code means different things: NOT_FOUND at reset is a bad task id, at a step a lost session."""
    return _error_class(code, phase)(f"{server}: {code.name}: {details or 'no details'}", server)


def _error_class(code: grpc.StatusCode, phase: Phase) -> type[EnvPoolError]:
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return Unauthenticated
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return StepTimedOut
    if phase != "step" and code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
        return NoServerAvailable
    if phase != "step" and code in _REQUEST_CODES:
        return UnknownEnvOrTask
    if phase == "step" and code is grpc.StatusCode.NOT_FOUND:
        return SessionLost
    if phase == "step" and code is grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidAction
    if phase == "step" and code is grpc.StatusCode.FAILED_PRECONDITION:
        return EpisodeOver
    if code in _LOST_CODES or code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return SessionLost
    return ServerError


# ---- what the trainer sees ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    """One reset (step_index 0) or step result, as the trainer uses it. `server` and `session_id` say
    where it was produced; after a replay they change while the episode stays the same."""

    observation: str
    admissible_actions: tuple[str, ...]
    reward: float
    terminated: bool
    truncated: bool
    won: bool
    score: float
    step_index: int
    env: str
    split: str
    task_id: str
    task_category: str
    instruction: str
    episode_id: str
    seed: int
    version: str
    server: str
    session_id: str
    info: Mapping[str, str] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def same_outcome(self, other: Transition) -> bool:
        """What a replay must reproduce: everything the env decided, not where or when it ran."""
        return _outcome(self) == _outcome(other)


def _outcome(t: Transition) -> tuple:
    return (t.step_index, t.observation, t.admissible_actions, t.reward, t.terminated, t.truncated, t.won,
            t.score, t.task_id, t.instruction)


def transition_from_proto(msg: env_pb2.Transition, *, episode_id: str, server: str) -> Transition:
    # The logical episode id, not the server's: a replayed session is opened under a derived id.
    return Transition(
        observation=msg.observation, admissible_actions=tuple(msg.admissible_actions), reward=msg.reward,
        terminated=msg.terminated, truncated=msg.truncated, won=msg.won, score=msg.score,
        step_index=msg.step_index, env=msg.env, split=msg.split, task_id=msg.task_id,
        task_category=msg.task_category, instruction=msg.instruction, episode_id=episode_id, seed=msg.seed,
        version=msg.version, server=server, session_id=msg.session_id, info=dict(msg.info),
    )


@dataclass(frozen=True)
class SplitInfo:
    name: str
    num_tasks: int
    categories: tuple[str, ...]
    num_excluded: int
    description: str


@dataclass(frozen=True)
class EnvInfo:
    """One env as the pool sees it across its servers."""

    name: str
    version: str
    default_max_turns: int
    splits: Mapping[str, SplitInfo]
    servers: tuple[str, ...]


def env_info_from_proto(msg: env_pb2.EnvInfo, servers: Iterable[str]) -> EnvInfo:
    splits = {
        s.name: SplitInfo(s.name, s.num_tasks, tuple(s.categories), s.num_excluded, s.description)
        for s in msg.splits
    }
    return EnvInfo(msg.name, msg.version, msg.default_max_turns, splits, tuple(sorted(servers)))


@dataclass(frozen=True)
class ServerStats:
    opened: int = 0
    steps: int = 0
    lost: int = 0


@dataclass(frozen=True)
class PoolStats:
    """Counters a trainer logs. `replays`: lost sessions rebuilt elsewhere; `dropped`: episodes given up."""

    opened: int = 0
    closed: int = 0
    steps: int = 0
    retries: int = 0
    lost: int = 0
    replays: int = 0
    dropped: int = 0
    by_server: Mapping[str, ServerStats] = field(default_factory=dict)


# ---- placement ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerLoad:
    """A server's load as placement sees it: the last GetLoad plus sessions this pool opened since."""

    address: str
    active: int
    capacity: int
    draining: bool

    @property
    def has_room(self) -> bool:
        return not self.draining and self.active < self.capacity


def placement_order(loads: Iterable[ServerLoad], avoid: frozenset[str] = frozenset()) -> list[str]:
    """Servers that can take a session, least loaded (by fill fraction, then count) first. `avoid` (the
    server an episode was just lost on) goes last rather than out: it may be the only one left."""
    open_servers = [load for load in loads if load.has_room]
    open_servers.sort(key=lambda s: (s.address in avoid, s.active / s.capacity, s.active, s.address))
    return [s.address for s in open_servers]
