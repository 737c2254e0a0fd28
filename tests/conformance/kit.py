"""Helpers of the conformance suite: the target under test and raw-channel calls with their deadlines.

Only the generated stubs are used here (never the trainer's pool), so the suite checks the wire itself.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass

import grpc
import pytest

from limen.env.v1 import env_pb2, env_pb2_grpc
from limen.env.v1.outcome import outcome as env_outcome

RESET_TIMEOUT_S = 120.0
CALL_TIMEOUT_S = 30.0
NOOP_ACTION = "conformance check: an action no env understands"
QUIET_TASK_PROBES = 10
DEFAULT_CONCURRENT_SESSIONS = 200


@dataclass(frozen=True)
class ConformanceTarget:
    address: str
    env: str
    split: str
    channel: grpc.aio.Channel
    stub: env_pb2_grpc.EnvServiceStub
    metadata: tuple[tuple[str, str], ...]
    listing: env_pb2.ListEnvsResponse
    concurrent_sessions: int = DEFAULT_CONCURRENT_SESSIONS

    @property
    def env_info(self) -> env_pb2.EnvInfo:
        return next(info for info in self.listing.envs if info.name == self.env)

    async def quiet_task_id(self) -> str:
        """A task whose episode (seed 0) survives two actions the env does not understand. Some tasks end
        on any first action (e.g. a toy "go to" task that starts in its target room)."""
        for task_id in (await self.task_ids())[:QUIET_TASK_PROBES]:
            first = await self.reset(task_id, max_turns=3)
            try:
                one = await self.step(first.session_id, 1, NOOP_ACTION)
                two = None if one.terminated else await self.step(first.session_id, 2, NOOP_ACTION)
            finally:
                await self.close(first.session_id)
            if two is not None and not two.terminated:
                return task_id
        pytest.fail(f"none of the first {QUIET_TASK_PROBES} tasks of {self.env}/{self.split} survives two "
                    "not-understood actions")

    async def task_ids(self) -> list[str]:
        reply = await self.stub.ListTasks(env_pb2.ListTasksRequest(env=self.env, split=self.split),
                                          timeout=CALL_TIMEOUT_S, metadata=self.metadata)
        assert reply.task_ids, f"{self.env}/{self.split} lists no playable task"
        return list(reply.task_ids)

    def reset_request(self, task_id: str, seed: int = 0, max_turns: int = 0, episode_id: str = "",
                      **fields) -> env_pb2.ResetRequest:
        return env_pb2.ResetRequest(env=self.env, split=self.split, task_id=task_id, seed=seed,
                                    max_turns=max_turns, episode_id=episode_id or uuid.uuid4().hex, **fields)

    async def reset(self, task_id: str, **fields) -> env_pb2.Transition:
        return await self.stub.Reset(self.reset_request(task_id, **fields), timeout=RESET_TIMEOUT_S,
                                     metadata=self.metadata)

    async def step(self, session_id: str, step_index: int, action: str | bytes,
                   timeout_s: float = CALL_TIMEOUT_S) -> env_pb2.Transition:
        action_bytes = action.encode() if isinstance(action, str) else action
        request = env_pb2.StepRequest(session_id=session_id, step_index=step_index, action=action_bytes)
        return await self.stub.Step(request, timeout=timeout_s, metadata=self.metadata)

    async def close(self, session_id: str) -> None:
        await self.stub.Close(env_pb2.CloseRequest(session_id=session_id), timeout=CALL_TIMEOUT_S,
                              metadata=self.metadata)

    async def load(self) -> env_pb2.GetLoadResponse:
        return await self.stub.GetLoad(env_pb2.GetLoadRequest(), timeout=CALL_TIMEOUT_S, metadata=self.metadata)

    def episode_stream(self) -> grpc.aio.StreamStreamCall:
        return self.stub.Episode(timeout=RESET_TIMEOUT_S * 5, metadata=self.metadata)


def default_split(listing: env_pb2.ListEnvsResponse, env: str) -> str:
    """The env's first split that has playable tasks."""
    infos = [info for info in listing.envs if info.name == env]
    if not infos:
        raise pytest.UsageError(f"the server does not host env {env!r}; it hosts {[i.name for i in listing.envs]}")
    for split in infos[0].splits:
        if split.num_tasks > 0:
            return split.name
    raise pytest.UsageError(f"env {env!r} has no split with playable tasks")


def outcome(transition: env_pb2.Transition) -> tuple:
    """What a deterministic server repeats for the same task, seed and actions: the env's outcome
    (limen.env.v1.outcome, the definition the trainer's and the server's replays use) at the same step of
    the same env version."""
    return transition.step_index, transition.version, *env_outcome(transition)


def scripted_action(transition: env_pb2.Transition, turn: int) -> str:
    """A deterministic policy that works on any env: the env's expert hint if it gives one, else cycle
    through the admissible actions, else an action it will not understand."""
    if transition.info.get("expert_action"):
        return transition.info["expert_action"]
    actions = list(transition.admissible_actions)
    return actions[turn % len(actions)] if actions else NOOP_ACTION


async def expect_status(call: Awaitable, *codes: grpc.StatusCode) -> grpc.aio.AioRpcError:
    """Await a call that must fail with one of `codes`; returns the error for further checks."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() in codes, (
        f"expected {[c.name for c in codes]}, got {caught.value.code().name}: {caught.value.details()}")
    return caught.value


async def eventually(predicate, timeout_s: float = 15.0, interval_s: float = 0.05) -> bool:
    """Poll an async predicate until it holds or the time is up (cleanup on the server is asynchronous)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(interval_s)
    return await predicate()
