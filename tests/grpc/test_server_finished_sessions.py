"""Issue 19 over the wire: finished sessions nobody closes are bounded (a grace for retries of the last
step, a cap, no capacity taken), a used step_index resent with another action is refused, and what the
worker processes and the metrics port expose."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import urllib.request

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2

from env_server.config import AUTH_TOKEN_ENV
from limen.env.v1 import env_pb2

SERVING = health_pb2.HealthCheckResponse.SERVING


def reset_request(task_id: str) -> env_pb2.EpisodeRequest:
    return env_pb2.EpisodeRequest(reset=env_pb2.ResetRequest(env="toy", split="train", task_id=task_id))


def step_request(step_index: int, action: str) -> env_pb2.EpisodeRequest:
    return env_pb2.EpisodeRequest(step=env_pb2.StepRequest(step_index=step_index, action=action.encode()))


async def finish_unclosed(server, task_id: str = "goto-000", seed: int = 0) -> list[env_pb2.Transition]:
    return await server.play_to_end(await server.reset(task_id, seed=seed))


# ---- finished sessions nobody closes ------------------------------------------------------------------
async def test_an_unclosed_finished_session_answers_retries_for_its_grace_then_is_released(launch):
    async with launch(finished_grace_s=1.0, rss_poll_s=0.1) as server:
        played = await finish_unclosed(server)
        last = played[-1]
        again = await server.step(last.session_id, last.step_index, played[-2].info["expert_action"])
        assert again == last   # a retry of the last step inside the grace gets the stored answer
        assert len(server.running.backend.table) == 1
        await _until(lambda: len(server.running.backend.table) == 0, timeout=10)
        error = await server.error(server.step(last.session_id, last.step_index, played[-2].info["expert_action"]))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert "finished at step" in error.details() and "kept 1 s" in error.details()
        error = await server.error(server.stub.Close(env_pb2.CloseRequest(session_id=last.session_id)))
        assert error.code() == grpc.StatusCode.NOT_FOUND


async def test_past_the_cap_the_oldest_unclosed_finished_sessions_are_released_first(launch):
    async with launch(max_finished_sessions=2, max_sessions=1) as server:
        episodes = [await finish_unclosed(server, seed=seed) for seed in range(4)]   # max_sessions 1: none counts
        for played, kept in zip(episodes, (False, False, True, True), strict=True):
            retry = server.step(played[-1].session_id, played[-1].step_index, played[-2].info["expert_action"])
            if kept:
                assert await retry == played[-1]
            else:
                error = await server.error(retry)
                assert error.code() == grpc.StatusCode.NOT_FOUND and "more than 2 finished" in error.details()
        assert len(server.running.backend.table) == 2


async def test_unclosed_finished_sessions_take_no_capacity_and_leave_readiness_alone(launch):
    async with launch(max_sessions=2) as server:
        for seed in range(6):
            await finish_unclosed(server, seed=seed)
        load = await server.load()
        assert load.active_sessions == 0 and dict(load.sessions_by_env) == {}
        assert await server.readiness() == SERVING
        first = await server.reset()
        second = await server.reset()
        error = await server.error(server.reset())
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (await server.load()).active_sessions == 2 and dict((await server.load()).sessions_by_env) == {"toy": 2}
        for t in (first, second):
            await server.stub.Close(env_pb2.CloseRequest(session_id=t.session_id))
        assert (await server.load()).active_sessions == 0


# ---- a used step_index with another action --------------------------------------------------------------
async def test_a_used_step_index_with_another_action_is_invalid_argument(server):
    first = await server.reset("fetch-001")
    one = await server.step(first.session_id, 1, "look")
    error = await server.error(server.step(first.session_id, 1, "inventory"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "already applied with action 'look', not 'inventory'" in error.details()
    assert await server.step(first.session_id, 1, "look") == one   # the true retry still works
    two = await server.step(first.session_id, 2, "inventory")
    assert two.step_index == 2 and two.observation != one.observation


async def test_a_conflicting_retry_of_the_final_step_is_refused_too(server):
    played = await finish_unclosed(server, "goto-003")
    last = played[-1]
    error = await server.error(server.step(last.session_id, last.step_index, "look"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "already applied" in error.details()


async def test_a_conflicting_retry_on_an_episode_stream_ends_the_stream_with_invalid_argument(server):
    call = server.stub.Episode()
    await call.write(reset_request("fetch-004"))
    await call.read()
    await call.write(step_request(1, "look"))
    await call.read()
    await call.write(step_request(1, "inventory"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "already applied" in caught.value.details()


# ---- what the workers and the metrics port expose ---------------------------------------------------------
async def test_worker_processes_do_not_inherit_the_auth_token(launch, monkeypatch):
    monkeypatch.setenv(AUTH_TOKEN_ENV, "s3cret-token")
    async with launch(auth_token="s3cret-token", workers=2) as server:
        pids = [w.pid for w in server.running.backend.load().workers]
        assert len(pids) == 4   # toy and faulty, two each
        for pid in pids:
            environment = psutil.Process(pid).environ()
            assert AUTH_TOKEN_ENV not in environment and environment.get("PYTHONPATH")
        assert os.environ[AUTH_TOKEN_ENV] == "s3cret-token"   # the server itself still reads it


async def test_metrics_stay_on_loopback_when_grpc_listens_on_every_interface(launch):
    async with launch(host="0.0.0.0", metrics_port=0) as server:
        port = server.running.metrics_port
        assert [ipaddress.ip_address(ip).is_loopback for ip in _listening_ips(port)] == [True]
        assert any(ip == "0.0.0.0" or ip == "::" for ip in _listening_ips(server.running.port))
        text = await asyncio.to_thread(_scrape, f"http://127.0.0.1:{port}/metrics")
        assert "limen_active_sessions" in text


async def test_metrics_listen_elsewhere_only_when_asked(launch):
    async with launch(metrics_host="0.0.0.0", metrics_port=0) as server:
        assert _listening_ips(server.running.metrics_port) == ["0.0.0.0"]


def _listening_ips(port: int) -> list[str]:
    return sorted({c.laddr.ip for c in psutil.Process().net_connections("inet")
                   if c.status == psutil.CONN_LISTEN and c.laddr.port == port})


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


async def _until(condition, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.05)


# ---- a finished episode's id (issue 40) ----------------------------------------------------------------
async def test_a_reset_with_a_finished_episodes_id_answers_that_it_ended(server):
    first = await server.reset("goto-000", episode_id="e", max_turns=1)
    last = await server.step(first.session_id, 1, "look")
    assert last.truncated
    for call in (server.reset("goto-000", episode_id="e", max_turns=1),
                 server.stub.Episode(iter([env_pb2.EpisodeRequest(reset=env_pb2.ResetRequest(
                     env="toy", split="train", task_id="goto-000", episode_id="e", max_turns=1))])).read()):
        error = await server.error(call)
        # Not the episode's start over again (a step-0 Transition that says it goes on), nor a new episode.
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "ended at step 1" in error.details() and "new episode_id" in error.details()
    assert (await server.load()).active_sessions == 0
    # Once the session is closed, the id is free again.
    await server.stub.Close(env_pb2.CloseRequest(session_id=first.session_id))
    again = await server.reset("goto-000", episode_id="e", max_turns=1)
    assert again.session_id != first.session_id and again.step_index == 0
