"""The worker processes of one env: least-loaded placement, replacement of dead workers, and recycling
by episode count or memory. Replay of lost sessions is the backend's job; a group only reports which
sessions a dead worker took with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from env_server.errors import NoWorker
from env_server.metrics import ServerMetrics
from env_server.workers.protocol import EnvDescription
from env_server.workers.worker import Worker

log = logging.getLogger("limen.env_server.workers")

SPAWN_ATTEMPTS = 2     # placements try this many rounds of spawning before giving up


@dataclass(frozen=True)
class RecyclePolicy:
    after_episodes: int = 0        # 0 = never
    rss_limit_bytes: int = 0       # 0 = no limit


class WorkerGroup:
    """`size` accepting workers of one env. New sessions go to the least-loaded one; dead workers are
    replaced at once, retired ones once their last session is done."""

    def __init__(self, env: str, entry_point: str, options: dict[str, Any], size: int,
                 recycle: RecyclePolicy, start_timeout_s: float, metrics: ServerMetrics,
                 on_orphaned: Callable[[Iterable[str]], None]) -> None:
        if size < 1:
            raise ValueError(f"a worker group needs at least one worker, got {size}")
        self.env = env
        self.size = size
        self._entry_point = entry_point
        self._options = dict(options)
        self._recycle = recycle
        self._start_timeout_s = start_timeout_s
        self._metrics = metrics
        self._on_orphaned = on_orphaned
        self._workers: list[Worker] = []
        self._spawn_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._last_spawn_error: BaseException | None = None
        self.description: EnvDescription | None = None

    @property
    def workers(self) -> tuple[Worker, ...]:
        return tuple(self._workers)

    async def start(self) -> EnvDescription:
        await self._replenish()
        if not self._workers:
            raise RuntimeError(f"no worker of env {self.env!r} could start: {self._last_spawn_error}")
        return self.description

    async def place(self, session_id: str) -> Worker:
        """The least-loaded accepting worker, now counting `session_id` among its sessions."""
        for _ in range(SPAWN_ATTEMPTS):
            candidates = [w for w in self._workers if w.accepting]
            if candidates:
                break
            await self._replenish()
        else:
            raise NoWorker(f"no {self.env} worker is available and none could be started: "
                           f"{self._last_spawn_error}")
        worker = min(candidates, key=lambda w: (len(w.sessions), w.episodes_served))
        worker.sessions.add(session_id)
        worker.episodes_served += 1
        if self._recycle.after_episodes and worker.episodes_served >= self._recycle.after_episodes:
            self.retire(worker, "episodes")
        return worker

    def settle(self, worker: Worker) -> None:
        """After a call: a retired worker whose sessions are all done leaves now."""
        if worker.retiring and not worker.sessions and worker in self._workers:
            self._workers.remove(worker)
            self._metrics.forget_worker(self.env, worker.pid)
            self._background(worker.stop())
            log.info("%s worker %d retired after %d episodes", self.env, worker.pid, worker.episodes_served)

    def retire(self, worker: Worker, reason: str) -> None:
        """No new sessions for `worker`; a fresh one takes its place and it leaves when it holds none."""
        if worker.retiring or worker not in self._workers:
            return
        worker.retiring = True
        self._metrics.worker_restarts.labels(self.env, reason).inc()
        log.info("retiring %s worker %d (%s): %d sessions left, %d episodes served",
                 self.env, worker.pid, reason, len(worker.sessions), worker.episodes_served)
        self._background(self._replenish())
        self.settle(worker)

    def discard(self, worker: Worker, reason: str) -> None:
        """`worker` died or was killed: replace it, and report the sessions it took with it."""
        if worker not in self._workers:
            return
        self._workers.remove(worker)
        worker.kill()
        self._metrics.forget_worker(self.env, worker.pid)
        if not worker.retiring:  # a retiring worker's replacement is already counted and started
            self._metrics.worker_restarts.labels(self.env, reason).inc()
        orphans, worker.sessions = worker.sessions, set()
        log.warning("%s worker %d lost (%s); %d other sessions to restore", self.env, worker.pid, reason,
                    len(orphans))
        self._background(self._replenish())
        self._on_orphaned(orphans)

    def poll_rss(self) -> None:
        for worker in list(self._workers):  # retiring one may remove it
            rss = worker.rss_bytes()
            self._metrics.worker_rss_bytes.labels(self.env, str(worker.pid)).set(rss)
            if self._recycle.rss_limit_bytes and rss > self._recycle.rss_limit_bytes:
                self.retire(worker, "rss")

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        workers, self._workers = self._workers, []
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)

    # ---- internals ----------------------------------------------------------------------------------
    async def _replenish(self) -> None:
        """Spawn workers until `size` accept sessions (one spawner at a time, so none too many)."""
        async with self._spawn_lock:
            missing = self.size - sum(w.accepting for w in self._workers)
            spawned = await asyncio.gather(
                *(Worker.spawn(self.env, self._entry_point, self._options, self._start_timeout_s)
                  for _ in range(max(0, missing))),
                return_exceptions=True)
            for outcome in spawned:
                if isinstance(outcome, BaseException):
                    self._last_spawn_error = outcome
                    log.error("could not start a %s worker: %s", self.env, outcome)
                    continue
                worker, description = outcome
                self.description = self.description or description
                self._workers.append(worker)
                worker.exited.add_done_callback(lambda _, w=worker: self.discard(w, "crashed"))

    def _background(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
