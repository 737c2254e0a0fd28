"""How a session talks to its server: unary calls with deadlines and retries, and the two transports
(Reset/Step/Close by session_id, or one Episode stream) behind one reset/step/close interface.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from limen.env.v1 import env_pb2
from trainer_client.env_pool.config import PoolConfig
from trainer_client.env_pool.errors import EnvPoolError, Phase, SessionLost, StepTimedOut, status_error
from trainer_client.env_pool.servers import Server
from trainer_client.env_pool.stats import Counters


class Calls:
    """Calls to any server with their deadline and bearer token; unary ones are retried on UNAVAILABLE."""

    def __init__(self, config: PoolConfig, counters: Counters) -> None:
        self.config = config
        self.metadata = config.call_metadata()
        self._counters = counters

    def timeout_s(self, phase: Phase) -> float:
        return {"reset": self.config.reset_timeout_s, "step": self.config.step_timeout_s,
                "query": self.config.query_timeout_s}[phase]

    async def unary(self, server: Server, method: str, request, *, phase: Phase, retry: bool = True):
        """One unary call with its deadline; retried with jittered backoff on UNAVAILABLE when `retry`."""
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.config.retry_attempts if retry else 1),
            wait=wait_exponential_jitter(initial=self.config.retry_initial_backoff_s,
                                         max=self.config.retry_max_backoff_s),
            retry=retry_if_exception(_is_unavailable), before_sleep=self._count_retry, reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await getattr(server.stub, method)(request, timeout=self.timeout_s(phase),
                                                              metadata=self.metadata)
        except grpc.aio.AioRpcError as error:
            raise status_error(error.code(), error.details(), phase, server.address) from error

    def new_session(self, server: Server) -> SessionHandle:
        """A session on `server` over the configured transport; `reset` opens it."""
        return _SESSION_TYPES[self.config.transport](self, server)

    def _count_retry(self, retry_state: RetryCallState) -> None:
        self._counters.count("retries")


class UnarySession:
    """Reset/Step/Close calls carrying session_id; steps are retried in place on UNAVAILABLE."""

    def __init__(self, calls: Calls, server: Server) -> None:
        self.calls, self.server = calls, server
        self.session_id = ""

    async def reset(self, request: env_pb2.ResetRequest) -> env_pb2.Transition:
        # No retry in place: UNAVAILABLE at reset usually means draining, so placement moves on instead.
        first = await self.calls.unary(self.server, "Reset", request, phase="reset", retry=False)
        self.session_id = first.session_id
        return first

    async def step(self, step_index: int, action: bytes) -> env_pb2.Transition:
        request = env_pb2.StepRequest(session_id=self.session_id, step_index=step_index, action=action)
        return await self.calls.unary(self.server, "Step", request, phase="step")

    async def close(self) -> None:
        if not self.session_id:   # the reset never answered: there is no id to close
            return
        # Best effort: a session the server already lost or reaped has nothing left to free.
        with contextlib.suppress(EnvPoolError):
            await self.calls.unary(self.server, "Close", env_pb2.CloseRequest(session_id=self.session_id),
                                   phase="query", retry=False)


class StreamSession:
    """One Episode stream: the stream is the session, so it cannot wander off its server."""

    def __init__(self, calls: Calls, server: Server) -> None:
        self.calls, self.server = calls, server
        self.call: grpc.aio.StreamStreamCall | None = None

    async def reset(self, request: env_pb2.ResetRequest) -> env_pb2.Transition:
        self.call = self.server.stub.Episode(timeout=self.calls.config.episode_timeout_s,
                                             metadata=self.calls.metadata)
        return await self._exchange(env_pb2.EpisodeRequest(reset=request), "reset")

    async def step(self, step_index: int, action: bytes) -> env_pb2.Transition:
        request = env_pb2.EpisodeRequest(step=env_pb2.StepRequest(step_index=step_index, action=action))
        return await self._exchange(request, "step")

    async def _exchange(self, request: env_pb2.EpisodeRequest, phase: Phase) -> env_pb2.Transition:
        timeout = self.calls.timeout_s(phase)
        if self.call.done():
            # Any error status ends a stream, even one that left the episode intact (a refused action).
            raise SessionLost(f"{self.server.address}: the episode stream has ended", self.server.address)
        try:
            async with asyncio.timeout(timeout):
                await self.call.write(request)
                reply = await self.call.read()
        except asyncio.CancelledError:
            # A reply may still be on its way; it must never be read as the answer to a later request.
            self.call.cancel()
            raise
        except TimeoutError:
            self.call.cancel()
            raise StepTimedOut(f"{self.server.address}: no answer to {phase} within {timeout:g}s",
                               self.server.address) from None
        except grpc.aio.AioRpcError as error:
            raise status_error(error.code(), error.details(), phase, self.server.address) from error
        except asyncio.InvalidStateError:
            # The stream had already finished (e.g. the server dropped it): its status says why.
            reply = grpc.aio.EOF
        if reply is grpc.aio.EOF:
            code, details = await self.call.code(), await self.call.details()
            if code is grpc.StatusCode.OK:
                raise SessionLost(f"{self.server.address}: the server ended the episode stream", self.server.address)
            raise status_error(code, details, phase, self.server.address)
        return reply

    async def close(self) -> None:
        if self.call is None or self.call.done():   # done() is also true once we cancelled it
            return
        try:
            # Half-close and let the server end the stream, so it frees the env before we move on.
            async with asyncio.timeout(self.calls.config.query_timeout_s):
                await self.call.done_writing()
                while await self.call.read() is not grpc.aio.EOF:
                    pass
        except (TimeoutError, grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass
        except asyncio.CancelledError:
            # grpc raises this for a call cancelled on our side meanwhile (a step's timeout); only the
            # cancellation of this task itself must go on up.
            if asyncio.current_task().cancelling():
                raise
        except Exception:
            # grpc's own ExecuteBatchError from done_writing() on a call cancelled on our side meanwhile (seen once
            # in the default suite); anything else on a live call is a real error.
            if not self.call.cancelled():
                raise
        finally:
            self.call.cancel()   # a no-op once the stream has finished


# The trainer's handle on one session of one server (the server's own record of it: env_server/sessions.py).
SessionHandle = UnarySession | StreamSession
_SESSION_TYPES: dict[str, type[UnarySession] | type[StreamSession]] = {
    "unary": UnarySession, "stream": StreamSession,
}


def _is_unavailable(error: BaseException) -> bool:
    return isinstance(error, grpc.aio.AioRpcError) and error.code() is grpc.StatusCode.UNAVAILABLE
