"""Sessions over the wire: many at once, streams that end early, capacity, readiness, idle expiry."""

import asyncio
import random

import grpc
import pytest
from grpc_health.v1 import health_pb2

from env_server.server import LIVENESS_SERVICE
from limen.env.v1 import env_pb2

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def reset_request(task_id: str, seed: int = 0) -> env_pb2.EpisodeRequest:
    return env_pb2.EpisodeRequest(reset=env_pb2.ResetRequest(env="toy", split="train", task_id=task_id, seed=seed))


def step_request(step_index: int, action: str) -> env_pb2.EpisodeRequest:
    return env_pb2.EpisodeRequest(step=env_pb2.StepRequest(step_index=step_index, action=action.encode()))


async def play_stream(stub, task_id: str, seed: int) -> list[env_pb2.Transition]:
    """One whole episode on an Episode stream, following the expert."""
    call = stub.Episode()
    await call.write(reset_request(task_id, seed))
    played = [await call.read()]
    while not (played[-1].terminated or played[-1].truncated):
        await call.write(step_request(len(played), played[-1].info["expert_action"]))
        played.append(await call.read())
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF
    return played


async def test_200_concurrent_sessions_on_one_server(server):
    async def play_unary(task_id: str, seed: int) -> list[env_pb2.Transition]:
        return await server.play_to_end(await server.reset(task_id, seed=seed))

    tasks = [f"{('goto', 'fetch', 'switch')[i % 3]}-{i % 120:03d}" for i in range(200)]
    # Half on Episode streams, half unary, all at once.
    episodes = await asyncio.gather(*(play_stream(server.stub, task, seed) if seed % 2 else play_unary(task, seed)
                                      for seed, task in enumerate(tasks)))
    assert len(episodes) == 200 and all(e[-1].won for e in episodes)
    assert len({e[0].session_id for e in episodes}) == 200
    assert all([t.step_index for t in e] == list(range(len(e))) for e in episodes)
    load = await server.load()
    assert load.active_sessions == 0 and sum(w.episodes_served for w in load.workers) == 200


async def test_same_task_and_seed_give_the_same_episode(server):
    first = await server.play_to_end(await server.reset("fetch-004", seed=11))
    again = await server.play_to_end(await server.reset("fetch-004", seed=11))
    strip = lambda ts: [(t.observation, list(t.admissible_actions), t.reward) for t in ts]  # noqa: E731
    assert strip(first) == strip(again)


async def test_client_cancelling_mid_stream_releases_the_session(server):
    call = server.stub.Episode()
    await call.write(reset_request("goto-003"))
    first = await call.read()
    await call.write(step_request(1, "look"))
    await call.read()
    assert (await server.load()).active_sessions == 1
    call.cancel()
    await _until(lambda load: load.active_sessions == 0, server)
    error = await server.error(server.step(first.session_id, 2, "look"))
    assert error.code() == grpc.StatusCode.NOT_FOUND and "Episode stream" in error.details()


async def test_client_cancelling_mid_step_releases_the_session(server):
    call = server.stub.Episode()
    await call.write(env_pb2.EpisodeRequest(reset=env_pb2.ResetRequest(env="faulty", split="train",
                                                                       task_id="goto-000")))
    await call.read()
    await call.write(step_request(1, "sleep 0.3"))
    await asyncio.sleep(0.1)
    call.cancel()  # while the worker is still stepping
    # The step finishes in the worker, then the session's env is closed there too.
    await _until(lambda load: load.active_sessions == 0 and not any(w.sessions for w in load.workers), server)
    assert (await server.reset("goto-000", env="faulty")).observation


async def test_an_abandoned_reset_is_released_unless_its_episode_id_can_claim_it(server):
    slow = {"reset_delay_s": "0.5"}
    error = await server.error(server.stub.Reset(
        env_pb2.ResetRequest(env="faulty", split="train", task_id="goto-000", options=slow), timeout=0.1))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # the client's own deadline
    claimable = env_pb2.ResetRequest(env="faulty", split="train", task_id="goto-003", options=slow, episode_id="e")
    await server.error(server.stub.Reset(claimable, timeout=0.1))
    await _until(lambda load: load.active_sessions == 1, server)  # only the one with an episode_id remains
    retried = await server.stub.Reset(claimable)
    assert retried.episode_id == "e" and retried.task_id == "goto-003"
    assert (await server.load()).active_sessions == 1


async def test_capacity_refuses_with_resource_exhausted_and_readiness_follows(launch):
    async with launch(max_sessions=2) as server:
        assert await server.readiness() == SERVING
        first = await server.reset("goto-000")
        await server.reset("goto-003")
        error = await server.error(server.reset("goto-006"))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "2 session slots" in error.details()
        assert await _readiness_becomes(server, NOT_SERVING)
        await server.play_to_end(first)  # a finished episode frees its slot
        assert await _readiness_becomes(server, SERVING)
        await server.reset("goto-006")


async def test_idle_sessions_expire(launch):
    async with launch(idle_ttl_s=0.4) as server:
        idle = await server.reset("goto-000")
        busy = await server.reset("goto-003")
        for index in range(1, 6):  # keep one session busy past the TTL
            await asyncio.sleep(0.15)
            await server.step(busy.session_id, index, "look")
        error = await server.error(server.step(idle.session_id, 1, "look"))
        assert error.code() == grpc.StatusCode.NOT_FOUND and "expired after 0.4 s idle" in error.details()
        assert (await server.load()).active_sessions == 1


async def test_draining_refuses_new_sessions_while_live_ones_finish(server):
    live = await server.reset("fetch-001")
    episode_id_kept = await server.reset("goto-000", episode_id="kept")
    server.running.backend.start_draining()
    assert await _readiness_becomes(server, NOT_SERVING)
    liveness = await server.health.Check(health_pb2.HealthCheckRequest(service=LIVENESS_SERVICE))
    assert liveness.status == SERVING
    error = await server.error(server.reset("goto-009"))
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "draining" in error.details()
    assert await server.reset("goto-000", episode_id="kept") == episode_id_kept  # a retry, not a new session
    assert (await server.play_to_end(live))[-1].won
    load = await server.load()
    assert load.draining and load.active_sessions == 1


async def _readiness_becomes(server, status: int, timeout: float = 5.0) -> bool:
    async def wait() -> None:
        while await server.readiness() != status:
            await asyncio.sleep(0.02)
    await asyncio.wait_for(wait(), timeout)
    return True


async def _until(predicate, server, timeout: float = 5.0) -> None:
    async def wait() -> None:
        while not predicate(await server.load()):
            await asyncio.sleep(0.02)
    await asyncio.wait_for(wait(), timeout)


@pytest.mark.parametrize("page_size", [0, 7, 50])
async def test_list_tasks_pages_cover_the_split_once(server, page_size):
    ids, token = [], ""
    while True:
        page = await server.stub.ListTasks(env_pb2.ListTasksRequest(env="faulty", split="train",
                                                                    page_size=page_size, page_token=token))
        ids += page.task_ids
        assert [t.task_id for t in page.tasks if not t.excluded_reason] == list(page.task_ids)
        token = page.next_page_token
        if not token:
            break
    assert len(ids) == len(set(ids)) == 120 and "excluded-000" not in ids


# ---- Resets abandoned just as the server answers (issue 40) -------------------------------------------
async def abandon_resets(stub, count: int, rng: random.Random) -> int:
    """Resets with a deadline of 0.4-1.2 ms, about what a toy reset takes, closing each that succeeds; the
    number that did not."""
    request = env_pb2.ResetRequest(env="toy", split="train", task_id="goto-000")
    failed = 0
    for _ in range(count):
        try:
            first = await stub.Reset(request, timeout=rng.uniform(0.4e-3, 1.2e-3))
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            failed += 1
        else:
            await stub.Close(env_pb2.CloseRequest(session_id=first.session_id))
    return failed


async def test_resets_abandoned_as_the_server_answers_hold_no_slot(launch):
    # Four clients at once: the server answers some Resets just as their deadline passes, and before the fix
    # 600 left 30-40 sessions live with no id anyone could close (they held their slots for idle_ttl_s).
    async with launch(envs=("toy",), entry_points={}, workers=2) as server:
        failed = await asyncio.gather(*(abandon_resets(server.stub, 150, random.Random(i)) for i in range(4)))
        assert sum(failed) > 0   # the deadlines did bite
        await _until(lambda load: load.active_sessions == 0, server, timeout=3.0)
        # A deadline that leaves time for the answer still gets its session.
        first = await server.stub.Reset(env_pb2.ResetRequest(env="toy", split="train", task_id="goto-000"),
                                        timeout=5.0)
        assert first.session_id and (await server.load()).active_sessions == 1
