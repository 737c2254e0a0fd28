"""A real env server on port 0 and a real channel to it, for the tests of the server over the wire.

`launch(**config_overrides)` starts one; `server` is one with the test defaults. The "faulty" env
(env_server.envs.testing) crashes, hangs or leaks on command.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from env_server.config import ServerConfig
from env_server.server import READINESS_SERVICE, RunningServer, serve
from limen.env.v1 import env_pb2, env_pb2_grpc

TEST_CONFIG = dict(
    envs=("toy", "faulty"), entry_points={"faulty": "env_server.envs.testing:FaultyEnv"}, port=0,
    metrics_port=-1, workers=1, step_timeout_s=5.0, reset_timeout_s=10.0, rss_poll_s=0.2,
)


@dataclass
class Harness:
    running: RunningServer
    channel: grpc.aio.Channel
    stub: env_pb2_grpc.EnvServiceStub
    health: health_pb2_grpc.HealthStub

    async def reset(self, task_id: str = "goto-000", env: str = "toy", split: str = "train",
                    **fields) -> env_pb2.Transition:
        return await self.stub.Reset(env_pb2.ResetRequest(env=env, split=split, task_id=task_id, **fields))

    async def step(self, session_id: str, step_index: int, action: str | bytes) -> env_pb2.Transition:
        raw = action.encode() if isinstance(action, str) else action
        return await self.stub.Step(env_pb2.StepRequest(session_id=session_id, step_index=step_index, action=raw))

    async def play_to_end(self, first: env_pb2.Transition) -> list[env_pb2.Transition]:
        """Follow the toy env's expert to the end of the episode; returns every transition."""
        played = [first]
        while not (played[-1].terminated or played[-1].truncated):
            played.append(await self.step(first.session_id, len(played), played[-1].info["expert_action"]))
        return played

    async def load(self) -> env_pb2.GetLoadResponse:
        return await self.stub.GetLoad(env_pb2.GetLoadRequest())

    @staticmethod
    async def error(call) -> grpc.aio.AioRpcError:
        """The error an awaited call fails with (the test fails if it succeeds)."""
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        return caught.value

    async def readiness(self) -> int:
        reply = await self.health.Check(health_pb2.HealthCheckRequest(service=READINESS_SERVICE))
        return reply.status


@pytest.fixture
def launch():
    @asynccontextmanager
    async def launch(channel_credentials=None, **overrides) -> AsyncIterator[Harness]:
        async with serve(ServerConfig(**{**TEST_CONFIG, **overrides})) as running:
            channel = (grpc.aio.secure_channel(running.address, channel_credentials) if channel_credentials
                       else grpc.aio.insecure_channel(running.address))
            async with channel:
                yield Harness(running, channel, env_pb2_grpc.EnvServiceStub(channel),
                              health_pb2_grpc.HealthStub(channel))
    return launch


@pytest.fixture
async def server(launch):
    async with launch() as harness:
        yield harness
