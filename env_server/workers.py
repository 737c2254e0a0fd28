"""Env worker processes as the server sees them: spawning, calls under a time budget, per-env groups
with least-loaded placement, replacement of dead workers, and recycling by episode count or memory.

Workers are started by exec (`python -m env_server.worker_main`), never by forking the gRPC process,
so a replacement spawned while the server runs is as safe as the first. Replay of lost sessions is
the backend's job; a group only reports which sessions a dead worker took with it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import socket
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import psutil

from env_server.config import AUTH_TOKEN_ENV
from env_server.metrics import ServerMetrics
from env_server.worker_protocol import (
    ACK, FRAME_HEADER, MAX_FRAME_BYTES, EnvDescription, EnvTimeout, WorkerCrashed, encode_frame,
)

log = logging.getLogger("limen.env_server.workers")

STOP_WAIT_S = 5.0      # a retired worker gets this long to exit on its own before it is killed
REAP_WAIT_S = 1.0      # a worker whose channel broke gets this long to show its exit code
SPAWN_ATTEMPTS = 2     # placements try this many rounds of spawning before giving up


# ---- failures only the server side sees --------------------------------------------------------------
class WorkerGone(Exception):
    """The worker was already dead before this call started: not the caller's doing, so retry."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(f"worker {worker.pid} of env {worker.env} has exited")
        self.worker = worker


class NoWorker(Exception):
    """No worker of the env could be started (UNAVAILABLE: another server may do)."""


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The asyncio twin of worker_protocol.read_frame_blocking, for the server's end of the socket."""
    (size,) = FRAME_HEADER.unpack(await reader.readexactly(FRAME_HEADER.size))
    if size > MAX_FRAME_BYTES:
        raise ConnectionError(f"worker sent a frame of {size} bytes")
    return pickle.loads(await reader.readexactly(size))


def worker_environment() -> dict[str, str]:
    """The server's environment minus its secrets (env code has no use for the bearer token), with the
    server's import path, so a worker imports what the server can (e.g. an env registered from a test dir)."""
    environment = {name: value for name, value in os.environ.items() if name != AUTH_TOKEN_ENV}
    environment["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return environment


# ---- one worker process ----------------------------------------------------------------------------
class Worker:
    """One process hosting env instances of many sessions of one env; it answers one call at a time.

    `sessions` holds the ids whose env instance lives here, as the worker itself reports after each call.
    """

    def __init__(self, env: str, proc: asyncio.subprocess.Process, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.env = env
        self.pid = proc.pid
        self.sessions: set[str] = set()
        self.episodes_served = 0
        self.retiring = False
        self._proc = proc
        self._reader = reader
        self._writer = writer
        self._closed = False
        self._lock = asyncio.Lock()
        self._psutil = psutil.Process(proc.pid)
        self.exited = asyncio.ensure_future(proc.wait())

    @classmethod
    async def spawn(cls, env: str, entry_point: str, options: dict[str, Any],
                    timeout: float) -> tuple[Worker, EnvDescription]:
        parent_end, child_end = socket.socketpair()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "env_server.worker_main", "--fd", str(child_end.fileno()),
                pass_fds=(child_end.fileno(),), stdin=asyncio.subprocess.DEVNULL,
                # Env code prints freely; the channel is the socket, so stdout can go nowhere.
                stdout=asyncio.subprocess.DEVNULL,
                # Own session: a Ctrl-C on the terminal drains the server instead of killing envs mid-step.
                start_new_session=True,
                env=worker_environment(),
            )
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()
        reader, writer = await asyncio.open_unix_connection(sock=parent_end)
        worker = cls(env, proc, reader, writer)
        try:
            description = await worker.call(("init", "", env, entry_point, dict(options)), timeout)
        except BaseException:
            await worker.stop()
            raise
        return worker, description

    @property
    def alive(self) -> bool:
        return not self._closed and self._proc.returncode is None

    @property
    def accepting(self) -> bool:
        return self.alive and not self.retiring

    async def call(self, request: tuple, timeout: float) -> Any:
        """Send (op, session_id, *args) and return the answer, raising the env's exception, EnvTimeout
        (the worker is then killed), WorkerCrashed, or WorkerGone (dead before the call began)."""
        op, session_id = request[0], request[1]
        async with self._lock:  # the wait for the lock is not part of the time budget
            if not self.alive:
                raise WorkerGone(self)
            try:
                async with asyncio.timeout(timeout):
                    status, value, holds = await self._exchange(request)
            except WorkerGone:
                await self._reap()
                raise
            except TimeoutError:
                self.kill()
                raise EnvTimeout(f"env {self.env} did not answer {op} within {timeout:g} s; "
                                 f"its worker (pid {self.pid}) was killed") from None
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                raise WorkerCrashed(f"the {self.env} worker (pid {self.pid}) died during {op}: "
                                    f"{await self._reap()}") from exc
        if session_id:
            (self.sessions.add if holds else self.sessions.discard)(session_id)
        if status == "error":
            raise value
        return value

    async def _exchange(self, request: tuple) -> tuple[str, Any, bool]:
        try:
            self._writer.write(encode_frame(request))
            await self._writer.drain()
            await self._reader.readexactly(len(ACK))
        except (asyncio.IncompleteReadError, ConnectionError):
            raise WorkerGone(self) from None  # it died before it read the request
        return await read_frame(self._reader)

    async def _reap(self) -> str:
        """After the channel broke: wait briefly for the exit, to report how it ended, and kill the
        process only if it lingers. (Signalling an exited child first would reap it under asyncio's
        child watcher, and its exit code would read 255.)"""
        self._closed = True
        self._writer.close()
        try:
            code = await asyncio.wait_for(asyncio.shield(self.exited), REAP_WAIT_S)
        except TimeoutError:
            self._proc.kill()
            return "its channel closed, so it was killed"
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"

    def rss_bytes(self) -> int:
        try:
            return self._psutil.memory_info().rss
        except psutil.Error:
            return 0

    def kill(self) -> None:
        self._closed = True
        if self._proc.returncode is None:
            self._proc.kill()
        self._writer.close()

    async def stop(self) -> None:
        """Let the worker exit on its own (it does when its socket closes), killing it after a while."""
        self._closed = True
        self._writer.close()
        try:
            await asyncio.wait_for(asyncio.shield(self.exited), STOP_WAIT_S)
        except TimeoutError:
            self._proc.kill()
            await self.exited


# ---- the workers of one env --------------------------------------------------------------------------
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
