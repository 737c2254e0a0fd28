"""Every error the server's own layers raise, with the status code the servicer answers it with.
(workers.worker.WorkerGone is not here: it never leaves the backend, which retries on another worker.)

The env's errors (unknown split or task, a step after the end, ...) belong to the env contract and live in
envs/base.py; service.STATUS_BY_ERROR maps both families. No imports beyond the env contract: worker
processes raise some of these, and they are pickled across to the server.
"""

from __future__ import annotations

from env_server.envs.base import EnvError


# ---- requests ------------------------------------------------------------------------------------------
class InvalidRequest(Exception):
    """A malformed request (INVALID_ARGUMENT)."""


class UnknownEnv(EnvError):
    """The env is not served here (NOT_FOUND)."""


class AnswerTooLate(Exception):
    """A Reset finished too close to its caller's deadline for the answer to arrive in time; its session
    was released rather than handed out (DEADLINE_EXCEEDED)."""


# ---- the session table ---------------------------------------------------------------------------------
class SessionError(Exception):
    """Base of the session table's own refusals; the servicer maps each to one status code."""


class StepIndexGap(InvalidRequest):
    """A step_index that is neither the next one nor one already applied (INVALID_ARGUMENT)."""


class ConflictingRetry(InvalidRequest):
    """A step_index already applied, sent again with another action: a client bug, not a retry
    (INVALID_ARGUMENT, like a step_index that skips ahead)."""


class UnknownSession(SessionError):
    """No such session here, or it was closed or expired (NOT_FOUND)."""


class ServerFull(SessionError):
    """Every session slot is taken (RESOURCE_EXHAUSTED)."""


class Draining(SessionError):
    """The server is shutting down and opens no new sessions (UNAVAILABLE)."""


# ---- worker calls: the session ends ----------------------------------------------------------------------
class WorkerFailure(Exception):
    """The env's process failed the session; the session ends (DEADLINE_EXCEEDED or ABORTED)."""

    reason = "failed"  # the limen_worker_restarts_total label when it costs the worker


class EnvTimeout(WorkerFailure):
    """A call ran past its time budget; the worker was killed (DEADLINE_EXCEEDED)."""

    reason = "timeout"


class WorkerCrashed(WorkerFailure):
    """The worker died while serving the call (ABORTED)."""

    reason = "crashed"


class EnvFailed(WorkerFailure):
    """The env raised an unexpected exception; its state is unknown, so the session ends (ABORTED)."""


class SessionLost(WorkerFailure):
    """The session's worker died and replaying it elsewhere failed or differed (ABORTED)."""


class ReplayMismatch(Exception):
    """A replayed observation differs from the recorded one (raised in the worker; the backend turns it
    into SessionLost)."""


# ---- worker placement -------------------------------------------------------------------------------------
class NoWorker(Exception):
    """No worker of the env could be started (UNAVAILABLE: another server may do)."""
