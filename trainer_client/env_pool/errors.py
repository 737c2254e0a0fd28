"""Every failure the env pool reports, and the rule that turns a gRPC status into one of them. No I/O here."""

from __future__ import annotations

from typing import ClassVar, Literal

import grpc


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
