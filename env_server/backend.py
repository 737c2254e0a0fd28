"""The server's domain call path, without gRPC: reset/step/close over the session table and the env
workers, replay of sessions whose worker died, idle reaping, draining, and load.

The servicer is a thin translation onto this; benchmarks call it directly to measure an in-process call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from env_server import registry
from env_server.config import MIB, ServerConfig
from env_server.envs.base import InvalidOptions, Split, StepResult, Task, UnknownSplit, unknown_options_problem
from env_server.episode import EpisodeSpec, RecordedStep
from env_server.errors import InvalidRequest, NoWorker, SessionLost, UnknownEnv, UnknownSession, WorkerFailure
from env_server.metrics import ServerMetrics
from env_server.sessions import Session, SessionTable
from env_server.workers.group import RecyclePolicy, WorkerGroup
from env_server.workers.protocol import CloseCall, EnvDescription, ResetCall, RestoreCall, SessionCall, StepCall
from env_server.workers.worker import Worker, WorkerGone

log = logging.getLogger("limen.env_server.backend")

# A call whose worker turns out dead before it starts is replayed elsewhere and retried this often.
WORKER_ATTEMPTS = 3


@dataclass(frozen=True)
class TaskPage:
    tasks: tuple[Task, ...]   # playable and excluded, in the split's stable order
    next_page_token: str      # "" on the last page


@dataclass(frozen=True)
class WorkerLoad:
    env: str
    pid: int
    sessions: int
    rss_bytes: int
    episodes_served: int


@dataclass(frozen=True)
class Load:
    active_sessions: int
    capacity: int
    draining: bool
    sessions_by_env: dict[str, int]
    workers: tuple[WorkerLoad, ...]
    server_id: str

    @property
    def worker_rss_bytes(self) -> int:
        return sum(w.rss_bytes for w in self.workers)


def is_ascii_number(text: str) -> bool:
    """Digits 0-9 only: str.isdecimal() also takes other scripts' digits ("٣" is 3 to int())."""
    return text.isascii() and text.isdecimal()


def page_of(tasks: tuple[Task, ...], page_size: int, page_token: str) -> TaskPage:
    """One page of `tasks`; page_size 0 means all of them. The token is the next offset, as text."""
    if page_size < 0:
        raise InvalidRequest(f"page_size must be >= 0, got {page_size}")
    # The length check comes first: int() refuses (ValueError) strings of over 4,300 digits.
    if page_token and not (is_ascii_number(page_token) and len(page_token) <= len(str(len(tasks)))
                           and int(page_token) <= len(tasks)):
        raise InvalidRequest(f"page_token {page_token!r} is not one this server issued")
    start = int(page_token or 0)
    end = len(tasks) if page_size == 0 else min(len(tasks), start + page_size)
    return TaskPage(tasks[start:end], str(end) if end < len(tasks) else "")


class EnvBackend:
    """Create with `open_backend(config)`; every public coroutine is safe against caller cancellation:
    a call the client abandons still completes and is recorded, so a retry finds it."""

    def __init__(self, config: ServerConfig, metrics: ServerMetrics, server_id: str = "") -> None:
        self.config = config
        self.metrics = metrics
        self.table = SessionTable(config.max_sessions, config.idle_ttl_s, server_id,
                                  finished_grace_s=config.finished_grace_s,
                                  max_finished=config.max_finished_sessions)
        self.groups: dict[str, WorkerGroup] = {}
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    @property
    def server_id(self) -> str:
        return self.table.server_id

    # ---- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        recycle = RecyclePolicy(self.config.recycle_after_episodes, int(self.config.worker_rss_limit_mb * MIB))
        for env in self.config.envs:
            self.groups[env] = WorkerGroup(
                env, _entry_point(env, self.config), dict(self.config.env_options.get(env, {})),
                self.config.workers_for(env), recycle, self.config.worker_start_timeout_s, self.metrics,
                self._restore_orphans)
        await asyncio.gather(*(group.start() for group in self.groups.values()))
        self.metrics.session_capacity.set(self.config.max_sessions)
        self._note_change()
        self._background(self._maintain())

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*(group.stop() for group in self.groups.values()))

    # ---- queries ------------------------------------------------------------------------------------
    def describe(self) -> list[EnvDescription]:
        return [group.description for group in self.groups.values()]

    def list_tasks(self, env: str, split: str, page_size: int, page_token: str) -> TaskPage:
        return page_of(self._split(env, split).tasks, page_size, page_token)

    def load(self) -> Load:
        workers = tuple(WorkerLoad(env, w.pid, len(w.sessions), w.rss_bytes(), w.episodes_served)
                        for env, group in self.groups.items() for w in group.workers)
        return Load(self.table.live_count(), self.table.capacity, self.table.draining, self.table.live_by_env(),
                    workers, self.server_id)

    @property
    def ready(self) -> bool:
        return self.table.ready

    async def wait_change(self) -> None:
        """Returns after the next change of load or readiness."""
        await self._changed.wait()
        self._changed.clear()

    # ---- episodes -----------------------------------------------------------------------------------
    async def reset(self, spec: EpisodeSpec) -> RecordedStep:
        """Start an episode (or return the first RecordedStep of the living one with this episode_id)."""
        self._split(spec.env, spec.split)  # fail fast, before a session slot is taken
        problem = unknown_options_problem(spec.env, self.groups[spec.env].description.reset_options,
                                          (key for key, _ in spec.options))
        if problem:
            raise InvalidOptions(problem)
        # A reset abandoned by its caller is released, unless its episode_id lets a retry claim it.
        on_abandoned = None if spec.episode_id else self._release_abandoned
        return await _detached(self._reset(spec), on_abandoned)

    async def step(self, session_id: str, step_index: int, action: str) -> RecordedStep:
        """Apply the action as step `step_index`, or return the stored RecordedStep when already applied."""
        session = self.table.get(session_id)
        return await _detached(self._step(session, step_index, action))

    async def close(self, session_id: str) -> None:
        session = self.table.get(session_id)
        await _detached(self._close(session))

    def release(self, session_id: str, why: str) -> None:
        """End a session now without waiting (its stream went away, or it idled out); the env instance
        is closed in the background once any call in flight has finished."""
        if session_id not in self.table:
            return
        session = self.table.get(session_id)
        self._end(session, UnknownSession(f"session {session_id} {why}"))
        self._background(self._drop_env_when_free(session))

    # ---- draining -----------------------------------------------------------------------------------
    def start_draining(self) -> None:
        self.table.draining = True
        self._note_change()

    async def wait_drained(self, timeout: float) -> bool:
        """True once no live episode is left, False if `timeout` passed first."""
        async def drained() -> None:
            while self.table.live_count():
                await self.wait_change()
        try:
            await asyncio.wait_for(drained(), timeout)
        except TimeoutError:
            return False
        return True

    # ---- the call paths -------------------------------------------------------------------------------
    async def _reset(self, spec: EpisodeSpec) -> RecordedStep:
        while True:
            session, created = self.table.open(spec)
            if created:
                break
            async with session.lock:  # the first Reset of this episode_id may still be running
                if session.transitions and session.ended is None:
                    self.table.refuse_if_finished(session)  # a step may have ended it while this one waited
                    return session.transitions[0]
            # That Reset failed or its session ended: open a fresh one.
        self._note_change()
        # Taking a free asyncio.Lock does not yield, so no other call sees the session before this one.
        async with session.lock:
            started = time.perf_counter()
            try:
                result = await self._run(session, ResetCall(session.session_id, spec), self.config.reset_timeout_s)
            except BaseException as exc:
                self._end(session, UnknownSession(f"session {session.session_id}: its reset failed: {exc}"))
                raise
            self.metrics.resets.labels(spec.env).inc()
            self.metrics.reset_latency.labels(spec.env).observe(time.perf_counter() - started)
            return self._record(session, result)

    async def _step(self, session: Session, step_index: int, action: str) -> RecordedStep:
        async with session.lock:
            self.table.check_not_ended(session)
            stored = self.table.stored_step(session, step_index, action)
            if stored is not None:
                self.table.touch(session)
                return stored
            started = time.perf_counter()
            try:
                result = await self._run(session, StepCall(session.session_id, action), self.config.step_timeout_s)
            except WorkerFailure as exc:
                self._end(session, _lost(session, exc))
                raise
            self.metrics.steps.labels(session.spec.env).inc()
            self.metrics.step_latency.labels(session.spec.env).observe(time.perf_counter() - started)
            return self._record(session, result, action)

    async def _close(self, session: Session) -> None:
        async with session.lock:
            self.table.check_not_ended(session)
            self._end(session, UnknownSession(f"session {session.session_id} was closed"))
            await self._drop_env(session)

    async def _run(self, session: Session, request: SessionCall | None, timeout: float) -> Any:
        """Send `request` to the worker holding the session (None: only make sure one holds it),
        rebuilding the session by replay first if its worker died."""
        group = self.groups[session.spec.env]
        for _ in range(WORKER_ATTEMPTS):
            try:
                worker = await self._live_worker(session, group)
                return None if request is None else await self._call(group, worker, request, timeout)
            except WorkerGone as gone:
                group.discard(gone.worker, "crashed")
        raise SessionLost(f"session {session.session_id}: {WORKER_ATTEMPTS} workers in a row died before "
                          "the call could start")

    async def _live_worker(self, session: Session, group: WorkerGroup) -> Worker:
        if session.worker is not None and session.worker.alive:
            return session.worker
        session.worker = worker = await group.place(session.session_id)
        if session.transitions:
            await self._replay(session, group, worker)
        return worker

    async def _replay(self, session: Session, group: WorkerGroup, worker: Worker) -> None:
        """Rebuild the session on `worker`: same spec, same actions, every observation checked."""
        request = RestoreCall(session.session_id, session.spec, tuple(session.actions), tuple(session.digests))
        budget = self.config.reset_timeout_s + self.config.step_timeout_s * len(session.actions)
        try:
            await self._call(group, worker, request, budget)
        except WorkerGone:
            raise
        except Exception as exc:
            raise SessionLost(f"session {session.session_id} lost its worker and could not be rebuilt: "
                              f"{exc}") from exc
        self.metrics.sessions_restored.inc()
        log.info("restored session %s on %s worker %d (%d actions replayed)", session.session_id,
                 group.env, worker.pid, len(session.actions))

    @staticmethod
    async def _call(group: WorkerGroup, worker: Worker, request: SessionCall, timeout: float) -> Any:
        try:
            return await worker.call(request, timeout)
        except WorkerFailure as exc:
            if not worker.alive:  # a timeout or crash costs the worker; its other sessions get restored
                group.discard(worker, exc.reason)
            raise
        finally:
            group.settle(worker)

    async def _drop_env(self, session: Session) -> None:
        worker = session.worker
        if worker is None or not worker.alive or session.session_id not in worker.sessions:
            return
        try:
            await self._call(self.groups[session.spec.env], worker, CloseCall(session.session_id),
                             self.config.step_timeout_s)
        except (WorkerFailure, WorkerGone) as exc:
            log.warning("closing session %s: %s", session.session_id, exc)

    async def _drop_env_when_free(self, session: Session) -> None:
        async with session.lock:
            await self._drop_env(session)

    # ---- bookkeeping --------------------------------------------------------------------------------
    def _record(self, session: Session, result: StepResult, action: str | None = None) -> RecordedStep:
        version = self.groups[session.spec.env].description.version
        transition = RecordedStep(session.session_id, len(session.transitions), session.spec, result, version)
        self.table.record(session, transition, action)
        if result.done:
            self._note_change()
        return transition

    def _end(self, session: Session, error: Exception) -> None:
        self.table.end(session, error)
        self._note_change()

    def _note_change(self) -> None:
        for env in self.groups:
            self.metrics.active_sessions.labels(env).set(self.table.live_count(env))
        self.metrics.draining.set(int(self.table.draining))
        self._changed.set()

    def _restore_orphans(self, session_ids: Iterable[str]) -> None:
        """Sessions whose worker died: rebuild each now, rather than on its next call."""
        for session_id in session_ids:
            if session_id in self.table:
                self._background(self._restore(self.table.get(session_id)))

    async def _restore(self, session: Session) -> None:
        async with session.lock:
            if not session.live:
                return
            try:
                await self._run(session, None, 0)
            except WorkerFailure as exc:
                self._end(session, _lost(session, exc))  # it answers ABORTED on its next call
                log.warning("%s", exc)
            except NoWorker as exc:
                log.warning("session %s waits for a worker: %s", session.session_id, exc)

    def _release_abandoned(self, transition: RecordedStep) -> None:
        self.release(transition.session_id, "was released: the client abandoned its Reset")

    async def _maintain(self) -> None:
        """Idle reaping, release of finished sessions past their grace, and worker memory, on one clock.
        Each pass costs what it expires, not the size of the table."""
        period = min(self.config.rss_poll_s, self.config.idle_ttl_s / 4,
                     self.config.finished_grace_s / 4 or self.config.rss_poll_s)
        while True:
            for group in self.groups.values():
                group.poll_rss()
            self.table.expire_finished()
            for session in self.table.idle():
                self.release(session.session_id, f"expired after {self.config.idle_ttl_s:g} s idle")
            await asyncio.sleep(period)

    def _split(self, env: str, split: str) -> Split:
        if not env or not split:
            raise InvalidRequest(f"env and split must be set, got env={env!r} split={split!r}")
        if env not in self.groups:
            raise UnknownEnv(f"env {env!r} is not served here; this server serves {sorted(self.groups)}")
        splits = self.groups[env].description.splits
        if split not in splits:
            raise UnknownSplit(f"{env}: no split {split!r}; splits are {sorted(splits)}")
        return splits[split]

    def _background(self, coro: Awaitable) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


@asynccontextmanager
async def open_backend(config: ServerConfig, metrics: ServerMetrics | None = None,
                       server_id: str = "") -> AsyncIterator[EnvBackend]:
    """A started backend (workers up, env metadata cached); stopped, workers and all, on exit."""
    backend = EnvBackend(config, metrics or ServerMetrics(), server_id)
    try:
        await backend.start()
        yield backend
    finally:
        await backend.stop()


def _entry_point(env: str, config: ServerConfig) -> str:
    if env in config.entry_points:
        registry.register(env, config.entry_points[env])
    if env not in registry.ENV_ENTRY_POINTS:
        raise ValueError(f"env {env!r} is not registered; registered: {sorted(registry.ENV_ENTRY_POINTS)}")
    return registry.ENV_ENTRY_POINTS[env]


def _lost(session: Session, exc: Exception) -> Exception:
    """The error later calls on an ended session get: ABORTED, with the cause."""
    return exc if isinstance(exc, SessionLost) else SessionLost(f"session {session.session_id} ended: {exc}")


async def _detached(coro: Awaitable, on_abandoned: Callable[[Any], None] | None = None) -> Any:
    """Await `coro` in a task of its own, so a cancelled caller (a client gone mid-call) cannot cut a
    worker exchange in half or lose a step the env already took."""
    task = asyncio.ensure_future(coro)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda done: _after_abandoned(done, on_abandoned))
        raise


def _after_abandoned(task: asyncio.Task, on_abandoned: Callable[[Any], None] | None) -> None:
    # Reading exception() also keeps asyncio from logging "exception was never retrieved".
    if not task.cancelled() and task.exception() is None and on_abandoned is not None:
        on_abandoned(task.result())
