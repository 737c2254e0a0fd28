"""The EnvService servicer: limen.env.v1 messages <-> backend calls, domain errors -> status codes.

Nothing else happens here; sessions, workers and limits live in the backend.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
from google.protobuf.message import DecodeError

from env_server.backend import EnvBackend, Load
from env_server.envs.base import EnvError, EpisodeOver, NotReset, Split, TaskExcluded, UnknownSplit, UnknownTask
from env_server.episode import EpisodeSpec, RecordedStep
from env_server.errors import (
    AnswerTooLate, Draining, EnvTimeout, InvalidRequest, NoWorker, ServerFull, UnknownEnv, UnknownSession,
    WorkerFailure,
)
from env_server.metrics import ServerMetrics
from env_server.workers.protocol import EnvDescription
from limen.env.v1 import env_pb2, env_pb2_grpc

log = logging.getLogger("limen.env_server.service")

# The most specific class in an error's MRO decides (env.proto lists these codes).
STATUS_BY_ERROR: dict[type[Exception], grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    DecodeError: grpc.StatusCode.INVALID_ARGUMENT,  # an Episode stream message that does not parse
    EnvError: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownEnv: grpc.StatusCode.NOT_FOUND,
    UnknownSplit: grpc.StatusCode.NOT_FOUND,
    UnknownTask: grpc.StatusCode.NOT_FOUND,
    UnknownSession: grpc.StatusCode.NOT_FOUND,
    TaskExcluded: grpc.StatusCode.FAILED_PRECONDITION,
    EpisodeOver: grpc.StatusCode.FAILED_PRECONDITION,
    NotReset: grpc.StatusCode.FAILED_PRECONDITION,
    ServerFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Draining: grpc.StatusCode.UNAVAILABLE,
    NoWorker: grpc.StatusCode.UNAVAILABLE,
    EnvTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    AnswerTooLate: grpc.StatusCode.DEADLINE_EXCEEDED,
    WorkerFailure: grpc.StatusCode.ABORTED,
}


# Details travel in a trailer that clients refuse above 8 KiB (and may drop above a soft limit), and they
# often quote the request. 512 characters stay under it even at 4 UTF-8 bytes each, percent-encoded (x3).
MAX_DETAILS_CHARS = 512


def status_for(error: Exception) -> grpc.StatusCode | None:
    return next((STATUS_BY_ERROR[cls] for cls in type(error).__mro__ if cls in STATUS_BY_ERROR), None)


def bounded_details(text: str) -> str:
    """Error details short enough to reach the client, however long the request field they quote."""
    if len(text) <= MAX_DETAILS_CHARS:
        return text
    return f"{text[:MAX_DETAILS_CHARS]}... ({len(text) - MAX_DETAILS_CHARS} more characters)"


# gRPC sends a call's deadline as a timeout rounded up (to the millisecond below 1 s, to 3 significant digits
# above), so the server's copy of it ends up to that much after the client's; the answer also needs time to
# travel. An answer ready within this margin of the deadline would likely reach a client that stopped waiting.
ANSWER_MARGIN_S = 0.002
ANSWER_MARGIN_FRACTION = 0.01


def answer_margin_s(timeout_s: float) -> float:
    return ANSWER_MARGIN_S + ANSWER_MARGIN_FRACTION * timeout_s


def answer_would_be_late(timeout_s: float | None, remaining_s: float | None) -> bool:
    """Whether an answer with `remaining_s` left of a call's deadline (`timeout_s` when the call began;
    None: no deadline) should be given up as undeliverable."""
    return timeout_s is not None and remaining_s is not None and remaining_s < answer_margin_s(timeout_s)


# ---- proto -> domain ---------------------------------------------------------------------------------
def decode_action(raw: bytes, max_bytes: int) -> str:
    if len(raw) > max_bytes:
        raise InvalidRequest(f"the action is {len(raw)} bytes; this server accepts at most {max_bytes}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"the action is not UTF-8: {exc.reason} at byte {exc.start}") from None


def spec_from_pb(request: env_pb2.ResetRequest) -> EpisodeSpec:
    return EpisodeSpec(request.env, request.split, request.task_id, request.seed, request.max_turns,
                       tuple(sorted(request.options.items())), request.episode_id)


# ---- domain -> proto ---------------------------------------------------------------------------------
def transition_pb(transition: RecordedStep) -> env_pb2.Transition:
    result, spec = transition.result, transition.spec
    return env_pb2.Transition(
        session_id=transition.session_id, step_index=transition.step_index,
        observation=result.observation, admissible_actions=result.admissible_actions, reward=result.reward,
        terminated=result.terminated, truncated=result.truncated, won=result.won, score=result.score,
        task_id=result.task_id, task_category=result.task_category, instruction=result.instruction,
        # The wire map is string -> string; an env that puts a number there still gets it across.
        info={key: str(value) for key, value in result.info.items()},
        version=transition.version, env=spec.env, split=spec.split, episode_id=spec.episode_id, seed=spec.seed)


def split_info_pb(split: Split) -> env_pb2.SplitInfo:
    playable = split.playable
    return env_pb2.SplitInfo(
        name=split.name, num_tasks=len(playable), categories=split.categories,
        tasks_per_category=Counter(task.category for task in playable),
        num_excluded=len(split.tasks) - len(playable), description=split.description)


def env_info_pb(description: EnvDescription) -> env_pb2.EnvInfo:
    return env_pb2.EnvInfo(
        name=description.name, version=description.version, code_version=description.code_version,
        data_hash=description.data_hash, splits=[split_info_pb(s) for s in description.splits.values()],
        default_max_turns=description.default_max_turns)


def load_pb(load: Load) -> env_pb2.GetLoadResponse:
    return env_pb2.GetLoadResponse(
        active_sessions=load.active_sessions, capacity=load.capacity, draining=load.draining,
        worker_rss_bytes=load.worker_rss_bytes, sessions_by_env=load.sessions_by_env, server_id=load.server_id,
        workers=[env_pb2.WorkerLoad(pid=w.pid, sessions=w.sessions, rss_bytes=w.rss_bytes,
                                    episodes_served=w.episodes_served) for w in load.workers])


class EnvService(env_pb2_grpc.EnvServiceServicer):
    def __init__(self, backend: EnvBackend, metrics: ServerMetrics, server_version: str) -> None:
        self._backend = backend
        self._metrics = metrics
        self._server_version = server_version
        self._max_action_bytes = backend.config.max_action_bytes

    async def ListEnvs(self, request: env_pb2.ListEnvsRequest, context) -> env_pb2.ListEnvsResponse:
        async with self._answering(context, "ListEnvs"):
            return env_pb2.ListEnvsResponse(envs=[env_info_pb(d) for d in self._backend.describe()],
                                            server_version=self._server_version)

    async def ListTasks(self, request: env_pb2.ListTasksRequest, context) -> env_pb2.ListTasksResponse:
        async with self._answering(context, "ListTasks"):
            page = self._backend.list_tasks(request.env, request.split, request.page_size, request.page_token)
            playable = [task for task in page.tasks if not task.excluded_reason]
            excluded = [task for task in page.tasks if task.excluded_reason]
            return env_pb2.ListTasksResponse(
                task_ids=[task.task_id for task in playable], next_page_token=page.next_page_token,
                tasks=[env_pb2.TaskInfo(task_id=t.task_id, category=t.category, excluded_reason=t.excluded_reason)
                       for t in playable + excluded])

    async def Reset(self, request: env_pb2.ResetRequest, context) -> env_pb2.Transition:
        async with self._answering(context, "Reset"):
            timeout_s = context.time_remaining()
            transition = await self._backend.reset(spec_from_pb(request))
            # grpc.aio does not tell a handler whether its answer reached the client, and a cancellation that
            # arrives once the handler has returned is not raised in it: without an episode_id, a session whose
            # answer is lost then holds a slot nobody can claim or close. So one unlikely to arrive in time is
            # released here instead (with an episode_id, a retry claims it as usual).
            if not transition.spec.episode_id and answer_would_be_late(timeout_s, context.time_remaining()):
                self._backend.release(transition.session_id, "was released: its Reset finished too close to the "
                                                             "client's deadline for the answer to arrive")
                raise AnswerTooLate(f"the reset finished within {answer_margin_s(timeout_s) * 1000:.0f} ms of the "
                                    "call's deadline, too late for its answer to arrive; its session was released")
            return transition_pb(transition)

    async def Step(self, request: env_pb2.StepRequest, context) -> env_pb2.Transition:
        async with self._answering(context, "Step"):
            action = decode_action(request.action, self._max_action_bytes)
            return transition_pb(await self._backend.step(request.session_id, request.step_index, action))

    async def Close(self, request: env_pb2.CloseRequest, context) -> env_pb2.CloseResponse:
        async with self._answering(context, "Close"):
            await self._backend.close(request.session_id)
            return env_pb2.CloseResponse()

    async def GetLoad(self, request: env_pb2.GetLoadRequest, context) -> env_pb2.GetLoadResponse:
        async with self._answering(context, "GetLoad"):
            return load_pb(self._backend.load())

    async def Episode(self, request_iterator, context) -> AsyncIterator[env_pb2.Transition]:
        """One episode per stream: a reset, then steps. The session ends with the stream, however it ends."""
        session_id = ""
        async with self._answering(context, "Episode"):
            try:
                async for request in request_iterator:
                    kind = request.WhichOneof("request")
                    if kind == "reset":
                        if session_id:
                            raise InvalidRequest("an Episode stream carries one episode: one reset, first")
                        transition = await self._backend.reset(spec_from_pb(request.reset))
                        session_id = transition.session_id
                    elif kind == "step":
                        if not session_id:
                            raise NotReset("the first message of an Episode stream must be a reset")
                        action = decode_action(request.step.action, self._max_action_bytes)
                        transition = await self._backend.step(session_id, request.step.step_index, action)
                    else:
                        raise InvalidRequest("an EpisodeRequest must carry a reset or a step")
                    yield transition_pb(transition)
            finally:
                if session_id:
                    self._backend.release(session_id, "ended with its Episode stream")

    @asynccontextmanager
    async def _answering(self, context: grpc.aio.ServicerContext, method: str) -> AsyncIterator[None]:
        """Turn a domain error raised inside into its status code, with the error's text as details."""
        try:
            yield
        except Exception as error:
            code = status_for(error)
            if code is None:
                if isinstance(error, grpc.aio.AbortError):
                    raise
                log.exception("%s failed unexpectedly", method)
                code = grpc.StatusCode.INTERNAL
            self._metrics.errors.labels(method, code.name).inc()
            await context.abort(code, bounded_details(str(error) or type(error).__name__))
