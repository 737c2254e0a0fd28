"""One env worker process as the server sees it: spawning, and calls under a time budget.

Workers are started by exec (`python -m env_server.workers.child`), never by forking the gRPC process,
so a replacement spawned while the server runs is as safe as the first.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import sys
from typing import Any

import psutil

from env_server.config import AUTH_TOKEN_ENV
from env_server.errors import EnvTimeout, WorkerCrashed
from env_server.workers.protocol import (
    ACK, FRAME_HEADER, MAX_FRAME_BYTES, EnvDescription, Reply, SessionCall, StartWorker, encode_frame,
)

STOP_WAIT_S = 5.0      # a retired worker gets this long to exit on its own before it is killed
REAP_WAIT_S = 1.0      # a worker whose channel broke gets this long to show its exit code
CHILD_MODULE = "env_server.workers.child"  # run with `python -m`


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The asyncio twin of protocol.read_frame_blocking, for the server's end of the socket."""
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


class WorkerGone(Exception):
    """The worker was already dead before this call started: not the caller's doing, so the backend
    replays the session on another worker and retries. Never reaches a client."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(f"worker {worker.pid} of env {worker.env} has exited")
        self.worker = worker


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
                sys.executable, "-m", CHILD_MODULE, "--fd", str(child_end.fileno()),
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
            description = await worker.call(StartWorker(env, entry_point, dict(options)), timeout)
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

    async def call(self, request: StartWorker | SessionCall, timeout: float) -> Any:
        """Send `request` and return the answer's value, raising the env's exception, EnvTimeout (the
        worker is then killed), WorkerCrashed, or WorkerGone (dead before the call began)."""
        op = request.op
        async with self._lock:  # the wait for the lock is not part of the time budget
            if not self.alive:
                raise WorkerGone(self)
            try:
                async with asyncio.timeout(timeout):
                    reply = await self._exchange(request)
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
        if isinstance(request, SessionCall):
            (self.sessions.add if reply.holds else self.sessions.discard)(request.session_id)
        if reply.error is not None:
            raise reply.error
        return reply.value

    async def _exchange(self, request: StartWorker | SessionCall) -> Reply:
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
