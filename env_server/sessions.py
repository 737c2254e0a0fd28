"""The session table: capacity, draining, idle expiry, step_index de-duplication, Reset idempotency.

Pure bookkeeping with no gRPC and no processes: it records what each session needs to be answered
again (its transitions) or rebuilt elsewhere (its episode spec, actions and observation digests).

Every operation costs the same however many sessions the table holds: live counts are kept per env
rather than counted, and expiry walks insertion-ordered dicts from the oldest end only as far as it
has something to expire. A finished episode (terminated or truncated) holds no env; its session is
kept only for retries of its last step: `finished_grace_s`, and at most `max_finished` of them (the
oldest finished go first).
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
from env_server.episode import EpisodeSpec, RecordedStep, result_digest
from env_server.errors import ConflictingRetry, Draining, InvalidRequest, ServerFull, StepIndexGap, UnknownSession

if TYPE_CHECKING:
    from env_server.workers.worker import Worker

# Ended session ids remembered so a late call learns why its session is gone; bounded, oldest dropped.
ENDED_MEMORY = 4096


@dataclass(eq=False)
class Session:
    session_id: str
    spec: EpisodeSpec
    last_used: float
    transitions: list[RecordedStep] = field(default_factory=list)
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
                 clock: Callable[[], float] = time.monotonic, finished_grace_s: float = 60.0,
                 max_finished: int = 1024) -> None:
        if capacity < 1 or idle_ttl_s <= 0 or finished_grace_s < 0 or max_finished < 0:
            raise ValueError(f"capacity must be >= 1, idle_ttl_s > 0, finished_grace_s and max_finished >= 0; "
                             f"got {capacity}, {idle_ttl_s}, {finished_grace_s}, {max_finished}")
        self.capacity = capacity
        self.idle_ttl_s = idle_ttl_s
        self.finished_grace_s = finished_grace_s
        self.max_finished = max_finished
        self.server_id = server_id or secrets.token_hex(6)
        self.draining = False
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._by_episode_id: dict[str, Session] = {}
        self._ended: OrderedDict[str, tuple[type[Exception], str]] = OrderedDict()
        # Live sessions, least recently used first (touch moves one to the end), so the idle sweep stops
        # at the first recent one.
        self._live: OrderedDict[str, Session] = OrderedDict()
        self._live_by_env: dict[str, int] = {}
        # Finished sessions by the time they finished, oldest first.
        self._finished: OrderedDict[str, tuple[float, Session]] = OrderedDict()

    # ---- opening -----------------------------------------------------------------------------------
    def open(self, spec: EpisodeSpec) -> tuple[Session, bool]:
        """The session for `spec`: its living session when the episode_id is known (created=False),
        else a new one (created=True). The caller runs the env reset and records it."""
        if spec.episode_id in self._by_episode_id:
            session = self._by_episode_id[spec.episode_id]
            if session.spec != spec:
                raise InvalidRequest(f"episode_id {spec.episode_id!r} is already in use by session "
                                     f"{session.session_id} with a different env/split/task/seed/options")
            self.refuse_if_finished(session)
            return session, False
        if self.draining:
            raise Draining("the server is draining and opens no new sessions; try another server")
        if self.live_count() >= self.capacity:
            raise ServerFull(f"all {self.capacity} session slots are taken; try another server or later")
        self.expire_finished()
        session = Session(f"{self.server_id}-{secrets.token_hex(8)}", spec, self._clock())
        self._sessions[session.session_id] = session
        self._live[session.session_id] = session
        self._live_by_env[spec.env] = self._live_by_env.get(spec.env, 0) + 1
        if spec.episode_id:
            self._by_episode_id[spec.episode_id] = session
        return session, True

    @staticmethod
    def refuse_if_finished(session: Session) -> None:
        """A Reset repeating a finished episode's id gets the episode's end, not its start over again: the
        first RecordedStep would say the episode goes on, and a new episode would make the id name two."""
        if session.done:
            raise EpisodeOver(f"episode_id {session.spec.episode_id!r} (session {session.session_id}) ended at "
                              f"step {len(session.transitions) - 1}; a new episode needs a new episode_id")

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
    def stored_step(session: Session, step_index: int, action: str) -> RecordedStep | None:
        """The stored RecordedStep when `step_index` was already applied with this same action (a retry);
        None when it is the next step to apply. Anything else is refused."""
        if step_index < 1:
            raise InvalidRequest(f"step_index counts from 1 within a session, got {step_index}")
        applied = len(session.transitions) - 1
        if step_index <= applied:
            # The actions are kept for replay anyway, so the check compares them whole, not a digest.
            applied_action = session.actions[step_index - 1]
            if action != applied_action:
                raise ConflictingRetry(
                    f"step_index {step_index} of session {session.session_id} was already applied with "
                    f"action {_clip(applied_action)}, not {_clip(action)}: a retry must resend the same "
                    f"action; the next step is {applied + 1}")
            return session.transitions[step_index]
        if step_index > applied + 1:
            raise StepIndexGap(f"step_index {step_index} skips ahead: session {session.session_id} "
                               f"has applied steps up to {applied}, so the next is {applied + 1}")
        if session.done:
            raise EpisodeOver(f"session {session.session_id}: the episode ended at step {applied}; "
                              "reset to start another")
        return None

    def record(self, session: Session, transition: RecordedStep, action: str | None = None) -> RecordedStep:
        """Store a reset (action None) or step result, with what a replay needs."""
        if transition.step_index != len(session.transitions):
            raise ValueError(f"transition {transition.step_index} recorded out of order "
                             f"after {len(session.transitions)}")
        was_live = session.live
        session.transitions.append(transition)
        session.digests.append(result_digest(transition.result))
        if action is not None:
            session.actions.append(action)
        self.touch(session)
        if was_live and transition.result.done:
            self._leave_live(session)
            self._finished[session.session_id] = (self._clock(), session)
            self.expire_finished()
        return transition

    def touch(self, session: Session) -> None:
        session.last_used = self._clock()
        if session.session_id in self._live:
            self._live.move_to_end(session.session_id)

    # ---- ending --------------------------------------------------------------------------------------
    def end(self, session: Session, error: Exception) -> None:
        """Remove the session; later calls on its id raise an error like `error`, with its message."""
        if session.ended is not None:
            return
        if session.session_id in self._live:
            self._leave_live(session)
        self._finished.pop(session.session_id, None)
        session.ended = error
        self._sessions.pop(session.session_id, None)
        if self._by_episode_id.get(session.spec.episode_id) is session:
            del self._by_episode_id[session.spec.episode_id]
        self._ended[session.session_id] = (type(error), str(error))
        if len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)

    def idle(self) -> list[Session]:
        """Live sessions untouched for idle_ttl_s, not counting any with a call in flight. Walks from the
        least recently used and stops at the first recent one."""
        cutoff = self._clock() - self.idle_ttl_s
        found = []
        for session in self._live.values():
            if session.last_used >= cutoff:
                break
            if not session.lock.locked():
                found.append(session)
        return found

    def expire_finished(self) -> None:
        """End finished sessions past their grace, and the oldest beyond max_finished. They hold no env,
        so there is nothing to free but the record; a call in flight on one finds it ended."""
        now = self._clock()
        while self._finished:
            finished_at, session = next(iter(self._finished.values()))
            over_count = len(self._finished) > self.max_finished
            if not over_count and now - finished_at < self.finished_grace_s:
                break
            why = (f"more than {self.max_finished} finished sessions are kept" if over_count
                   else f"finished sessions are kept {self.finished_grace_s:g} s")
            self.end(session, UnknownSession(
                f"session {session.session_id} finished at step {len(session.transitions) - 1} and was "
                f"released ({why}, for retries of their last step; Close a session once it ends)"))

    # ---- load ----------------------------------------------------------------------------------------
    def live_count(self, env: str | None = None) -> int:
        return len(self._live) if env is None else self._live_by_env.get(env, 0)

    def live_by_env(self) -> dict[str, int]:
        return {env: count for env, count in self._live_by_env.items() if count}

    def finished_count(self) -> int:
        return len(self._finished)

    def _leave_live(self, session: Session) -> None:
        del self._live[session.session_id]
        self._live_by_env[session.spec.env] -= 1

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


def _clip(text: str, limit: int = 80) -> str:
    """An action quoted in an error, short enough that two fit in the details."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"
