"""The session table: capacity, draining, idle expiry, step_index de-duplication, Reset idempotency.

Pure bookkeeping with no gRPC and no processes: it records what each session needs to be answered
again (its transitions) or rebuilt elsewhere (its episode spec, actions and observation digests).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from env_server.envs.base import EpisodeOver
from env_server.episode import EpisodeSpec, InvalidRequest, Transition, result_digest

if TYPE_CHECKING:
    from env_server.workers import Worker

# Ended session ids remembered so a late call learns why its session is gone; bounded, oldest dropped.
ENDED_MEMORY = 4096


class SessionError(Exception):
    """Base of the table's own refusals; the servicer maps each to one status code."""


class StepIndexGap(InvalidRequest):
    """A step_index that is neither the next one nor one already applied (INVALID_ARGUMENT)."""


class UnknownSession(SessionError):
    """No such session here, or it was closed or expired (NOT_FOUND)."""


class ServerFull(SessionError):
    """Every session slot is taken (RESOURCE_EXHAUSTED)."""


class Draining(SessionError):
    """The server is shutting down and opens no new sessions (UNAVAILABLE)."""


@dataclass(eq=False)
class Session:
    session_id: str
    spec: EpisodeSpec
    last_used: float
    transitions: list[Transition] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    # The worker process holding the env instance; None before the first reset. If it died, the next
    # call rebuilds the session on another one by replay.
    worker: Worker | None = None
    # Serializes the calls of one session; held while a call is in flight, so the reaper skips it.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Set when the session leaves the table; a call that waited on `lock` must not proceed.
    ended: Exception | None = None

    @property
    def done(self) -> bool:
        return bool(self.transitions) and self.transitions[-1].result.done

    @property
    def live(self) -> bool:
        """Holds (or is about to hold) an env instance: counts against capacity."""
        return self.ended is None and not self.done


class SessionTable:
    """Sessions by id, plus the episode_id index and the reasons of recently ended ones."""

    def __init__(self, capacity: int, idle_ttl_s: float, server_id: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        if capacity < 1 or idle_ttl_s <= 0:
            raise ValueError(f"capacity must be >= 1 and idle_ttl_s > 0, got {capacity}, {idle_ttl_s}")
        self.capacity = capacity
        self.idle_ttl_s = idle_ttl_s
        self.server_id = server_id or secrets.token_hex(6)
        self.draining = False
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._by_episode_id: dict[str, Session] = {}
        self._ended: OrderedDict[str, tuple[type[Exception], str]] = OrderedDict()

    # ---- opening -----------------------------------------------------------------------------------
    def open(self, spec: EpisodeSpec) -> tuple[Session, bool]:
        """The session for `spec`: its living session when the episode_id is known (created=False),
        else a new one (created=True). The caller runs the env reset and records it."""
        if spec.episode_id in self._by_episode_id:
            session = self._by_episode_id[spec.episode_id]
            if session.spec != spec:
                raise InvalidRequest(f"episode_id {spec.episode_id!r} is already in use by session "
                                     f"{session.session_id} with a different env/split/task/seed/options")
            return session, False
        if self.draining:
            raise Draining("the server is draining and opens no new sessions; try another server")
        if self.live_count() >= self.capacity:
            raise ServerFull(f"all {self.capacity} session slots are taken; try another server or later")
        session = Session(f"{self.server_id}-{secrets.token_hex(8)}", spec, self._clock())
        self._sessions[session.session_id] = session
        if spec.episode_id:
            self._by_episode_id[spec.episode_id] = session
        return session, True

    # ---- lookup and steps --------------------------------------------------------------------------
    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            error_type, why = self._ended.get(session_id, (UnknownSession, f"no session {session_id!r} on this server"))
            raise error_type(why)
        return session

    @staticmethod
    def check_not_ended(session: Session) -> None:
        """For a call that waited on the session's lock: the session may have ended meanwhile."""
        if session.ended is not None:
            raise type(session.ended)(str(session.ended))

    @staticmethod
    def stored_step(session: Session, step_index: int) -> Transition | None:
        """The stored Transition when `step_index` was already applied (a retry); None when it is the
        next step to apply. Anything else is refused."""
        if step_index < 1:
            raise InvalidRequest(f"step_index counts from 1 within a session, got {step_index}")
        applied = len(session.transitions) - 1
        if step_index <= applied:
            return session.transitions[step_index]
        if step_index > applied + 1:
            raise StepIndexGap(f"step_index {step_index} skips ahead: session {session.session_id} "
                               f"has applied steps up to {applied}, so the next is {applied + 1}")
        if session.done:
            raise EpisodeOver(f"session {session.session_id}: the episode ended at step {applied}; "
                              "reset to start another")
        return None

    def record(self, session: Session, transition: Transition, action: str | None = None) -> Transition:
        """Store a reset (action None) or step result, with what a replay needs."""
        if transition.step_index != len(session.transitions):
            raise ValueError(f"transition {transition.step_index} recorded out of order "
                             f"after {len(session.transitions)}")
        session.transitions.append(transition)
        session.digests.append(result_digest(transition.result))
        if action is not None:
            session.actions.append(action)
        self.touch(session)
        return transition

    def touch(self, session: Session) -> None:
        session.last_used = self._clock()

    # ---- ending --------------------------------------------------------------------------------------
    def end(self, session: Session, error: Exception) -> None:
        """Remove the session; later calls on its id raise an error like `error`, with its message."""
        if session.ended is not None:
            return
        session.ended = error
        self._sessions.pop(session.session_id, None)
        if self._by_episode_id.get(session.spec.episode_id) is session:
            del self._by_episode_id[session.spec.episode_id]
        self._ended[session.session_id] = (type(error), str(error))
        if len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)

    def idle(self) -> list[Session]:
        """Sessions untouched for idle_ttl_s, not counting any with a call in flight."""
        cutoff = self._clock() - self.idle_ttl_s
        return [s for s in self._sessions.values() if s.last_used < cutoff and not s.lock.locked()]

    # ---- load ----------------------------------------------------------------------------------------
    def live_count(self, env: str | None = None) -> int:
        return sum(s.live for s in self._sessions.values() if env is None or s.spec.env == env)

    def live_by_env(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for s in self._sessions.values():
            if s.live:
                counts[s.spec.env] = counts.get(s.spec.env, 0) + 1
        return counts

    @property
    def full(self) -> bool:
        return self.live_count() >= self.capacity

    @property
    def ready(self) -> bool:
        """Readiness: this server would accept a new session now."""
        return not self.draining and not self.full

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions
