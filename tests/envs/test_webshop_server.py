"""The scripted WebShop oracle over the wire: a real env server (worker process, gRPC channel) plays the
test goals of the 1k world. Every miss measured is the original reward's option quirk (see README)."""

from __future__ import annotations

import grpc
import pytest

from env_server.config import ServerConfig
from env_server.server import serve
from limen.env.v1 import env_pb2, env_pb2_grpc
from webshop_fixtures import real_world_dir

pytestmark = pytest.mark.data


async def play_oracle(stub: env_pb2_grpc.EnvServiceStub, task_id: str) -> env_pb2.Transition:
    transition = await stub.Reset(env_pb2.ResetRequest(env="webshop", split="test", task_id=task_id))
    step_index = 0
    while not (transition.terminated or transition.truncated) and "expert_action" in transition.info:
        step_index += 1
        transition = await stub.Step(env_pb2.StepRequest(
            session_id=transition.session_id, step_index=step_index,
            action=transition.info["expert_action"].encode()))
    await stub.Close(env_pb2.CloseRequest(session_id=transition.session_id))
    return transition


async def oracle_wins_over_the_wire(num_goals: int) -> int:
    config = ServerConfig(envs=("webshop",), env_options={"webshop": {"data_dir": real_world_dir()}},
                          port=0, metrics_port=-1, workers=1, reset_timeout_s=120.0)
    async with serve(config) as running, grpc.aio.insecure_channel(running.address) as channel:
        stub = env_pb2_grpc.EnvServiceStub(channel)
        listing = await stub.ListTasks(env_pb2.ListTasksRequest(env="webshop", split="test"))
        assert list(listing.task_ids) == [str(i) for i in range(500)]
        finals = [await play_oracle(stub, task_id) for task_id in listing.task_ids[:num_goals]]
    assert all(t.terminated and t.reward == (1.0 if t.won else 0.0) for t in finals)
    return sum(t.won for t in finals)


async def test_oracle_over_the_wire_wins_95_percent_of_the_first_100_test_goals():
    assert await oracle_wins_over_the_wire(100) >= 95      # 97 measured


@pytest.mark.slow
async def test_oracle_over_the_wire_wins_95_percent_of_all_500_test_goals():
    assert await oracle_wins_over_the_wire(500) >= 475     # 480 measured
