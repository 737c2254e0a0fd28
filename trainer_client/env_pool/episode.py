"""One episode as a trainer plays it: its spec, recorded actions and transitions, and the session that
holds it now; a lost session is rebuilt elsewhere by replaying the record."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from limen.env.v1 import env_pb2
from trainer_client.env_pool.broker import SessionBroker
from trainer_client.env_pool.errors import EnvPoolError, EpisodeDropped, EpisodeOver, InvalidAction, ReplayMismatch
from trainer_client.env_pool.transport import SessionHandle
from trainer_client.env_pool.replies import Transition, transition_from_proto


@dataclass(frozen=True)
class EpisodeRecipe:
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


class Episode:
    """One episode: its recorded actions and transitions, and the session that currently holds it.

    When the session is lost (recoverable errors), the episode is re-created on another server with the
    same task and seed, its actions are replayed, and every replayed transition must equal the recorded
    one; then play continues as if nothing happened. Past `replay_attempts`, it raises EpisodeDropped.
    """

    def __init__(self, broker: SessionBroker, spec: EpisodeRecipe, on_end: Callable[[Episode], None]) -> None:
        self.spec = spec
        self._broker = broker
        self._on_end = on_end   # the pool stops tracking the episode once it is closed or dropped
        self._session: SessionHandle | None = None
        self._sessions_opened = 0
        self._lost_on: frozenset[str] = frozenset()   # where the last session was lost: placed last
        self._actions: list[str] = []
        self._transitions: list[Transition] = []
        self._lock = asyncio.Lock()
        self._ended: str = ""   # why no further step is allowed: "closed" or "dropped"

    @classmethod
    async def open(cls, broker: SessionBroker, spec: EpisodeRecipe, on_end: Callable[[Episode], None]) -> Episode:
        """Start the episode on its first session; `first` is then the reset."""
        episode = cls(broker, spec, on_end)
        async with episode._lock:
            reply = await episode._with_recovery(None)
            episode._transitions.append(episode._accept(reply))
        return episode

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
            transition = self._accept(reply)
            self._actions.append(action)
            self._transitions.append(transition)
            return transition

    async def close(self) -> None:
        """Free the server session. Safe to call twice; never raises for infrastructure trouble."""
        if not self._ended:
            self._ended = "closed"
        session, self._session = self._session, None
        if session is not None:
            await self._broker.release(session)
        self._on_end(self)

    async def __aenter__(self) -> Episode:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    # ---- the replay machinery ---------------------------------------------------------------------------
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
                if error.recoverable and failures < self._broker.config.replay_attempts:
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
        session, first = await self._broker.open(self.spec.reset_request(attempt), self._lost_on)
        self._sessions_opened += 1
        try:
            self._check_replayed(0, first, session)
            for step_index, action in enumerate(self._actions, 1):
                self._check_replayed(step_index, await session.step(step_index, action.encode()), session)
        except BaseException as error:
            self._broker.abandon(session, lost=isinstance(error, EnvPoolError) and error.recoverable)
            raise
        self._session = session
        if attempt:
            self._broker.count("replays")
        return first

    def _check_replayed(self, step_index: int, reply: env_pb2.Transition, session: SessionHandle) -> None:
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
            self._broker.abandon(session, lost=error is not None)

    def _drop(self, cause: EnvPoolError, failures: int) -> EpisodeDropped:
        self._ended = "dropped"
        self._broker.count("dropped")
        self._on_end(self)
        return EpisodeDropped(
            f"episode {self.episode_id} ({self.spec.env}/{self.spec.split}/{self.spec.task_id}, seed "
            f"{self.spec.seed}) dropped after {failures} replay(s) at step {len(self._actions)}: {cause}"
        )

    def _accept(self, reply: env_pb2.Transition) -> Transition:
        """A reply of the current session as the trainer sees it (the broker checks its version)."""
        return self._broker.accept(reply, self.spec.env, self.episode_id, self._session)
