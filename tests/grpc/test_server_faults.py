"""One crashed, hung or leaking env costs at most its own session, never the server or its neighbours.

The "faulty" env crashes, hangs, raises or leaks on command; with one worker per env, every session of
a test shares that worker, so a neighbour's survival is really tested.
"""

import asyncio
import os
import signal

import grpc

from limen.env.v1 import env_pb2


def sample(server, name: str, **labels) -> float:
    return server.running.backend.metrics.registry.get_sample_value(name, labels) or 0.0


def observations(transitions) -> list[tuple]:
    return [(t.observation, list(t.admissible_actions), t.reward, t.won) for t in transitions]


async def faulty_pid(server) -> int:
    return server.running.backend.groups["faulty"].workers[0].pid


async def play_on(server, first, steps_before_fault: int):
    """Play `steps_before_fault` expert steps of `first`'s episode; returns the transitions so far."""
    played = [first]
    for index in range(1, steps_before_fault + 1):
        played.append(await server.step(first.session_id, index, played[-1].info["expert_action"]))
    return played


async def finish(server, played):
    while not (played[-1].terminated or played[-1].truncated):
        played.append(await server.step(played[0].session_id, len(played), played[-1].info["expert_action"]))
    return played


async def test_a_crash_costs_one_session_and_its_neighbour_is_restored(server):
    reference = await server.play_to_end(await server.reset("fetch-007", env="faulty", seed=5))
    neighbour = await play_on(server, await server.reset("fetch-007", env="faulty", seed=5), 2)
    culprit = await server.reset("goto-000", env="faulty")
    pid = await faulty_pid(server)

    error = await server.error(server.step(culprit.session_id, 1, "crash"))
    assert error.code() == grpc.StatusCode.ABORTED and "died during step" in error.details()
    assert "exit code 3" in error.details()

    played = await finish(server, neighbour)
    assert observations(played) == observations(reference) and played[-1].won
    assert await faulty_pid(server) != pid
    assert sample(server, "limen_sessions_restored_total") == 1
    assert sample(server, "limen_worker_restarts_total", env="faulty", reason="crashed") == 1
    later = await server.error(server.step(culprit.session_id, 1, "look"))
    assert later.code() == grpc.StatusCode.ABORTED and "ended" in later.details()


async def test_a_hung_step_is_cut_at_its_budget_and_the_worker_replaced(launch):
    async with launch(step_timeout_s=0.5) as server:
        neighbour = await play_on(server, await server.reset("fetch-007", env="faulty", seed=5), 1)
        culprit = await server.reset("goto-000", env="faulty")
        pid = await faulty_pid(server)
        error = await server.error(server.step(culprit.session_id, 1, "hang"))
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "within 0.5 s" in error.details()
        assert (await finish(server, neighbour))[-1].won
        assert await faulty_pid(server) != pid
        assert sample(server, "limen_worker_restarts_total", env="faulty", reason="timeout") == 1
        # Steps queued behind the hung one are not charged for its time.
        sessions = [await server.reset(f"goto-00{i}", env="faulty") for i in (0, 3)]
        slow = [server.step(s.session_id, 1, "sleep 0.3") for s in sessions]
        assert all(t.observation.startswith("Slept") for t in await asyncio.gather(*slow))


async def test_an_env_exception_ends_its_session_only(server):
    neighbour = await server.reset("goto-003", env="faulty")
    culprit = await server.reset("goto-000", env="faulty")
    pid = await faulty_pid(server)
    error = await server.error(server.step(culprit.session_id, 1, "raise"))
    assert error.code() == grpc.StatusCode.ABORTED and "RuntimeError: the env failed on purpose" in error.details()
    assert await faulty_pid(server) == pid  # the process is fine; only that env's state is suspect
    assert (await server.step(neighbour.session_id, 1, "look")).step_index == 1
    assert (await server.load()).active_sessions == 1


async def test_a_session_that_cannot_be_replayed_answers_aborted(server):
    random_history = await server.reset("goto-003", env="faulty")
    await server.step(random_history.session_id, 1, "coin")  # no replay can reproduce this
    culprit = await server.reset("goto-000", env="faulty")
    await server.error(server.step(culprit.session_id, 1, "crash"))
    error = await server.error(server.step(random_history.session_id, 2, "look"))
    assert error.code() == grpc.StatusCode.ABORTED and "different observation" in error.details()
    assert (await server.load()).active_sessions == 0


async def test_a_worker_killed_from_outside_loses_no_session(server):
    sessions = [await play_on(server, await server.reset(task, env="faulty"), 1)
                for task in ("fetch-001", "switch-005")]
    os.kill(await faulty_pid(server), signal.SIGKILL)
    for played in sessions:
        assert (await finish(server, played))[-1].won
    assert sample(server, "limen_sessions_restored_total") == 2


async def test_recycling_after_n_episodes_loses_nothing(launch):
    async with launch(recycle_after_episodes=3) as server:
        pids = set()

        async def episode(task_id: str) -> bool:
            first = await server.reset(task_id, env="faulty")
            pids.update(w.pid for w in server.running.backend.groups["faulty"].workers)
            await asyncio.sleep(0.05)  # overlap episodes, so a retiring worker still has live ones
            return (await server.play_to_end(first))[-1].won

        tasks = [f"{('goto', 'fetch', 'switch')[i % 3]}-{i:03d}" for i in range(12)]
        results = await asyncio.gather(*(episode(t) for t in tasks[:6]))
        results += await asyncio.gather(*(episode(t) for t in tasks[6:]))
        assert all(results) and len(results) == 12
        assert len(pids) >= 4
        assert sample(server, "limen_worker_restarts_total", env="faulty", reason="episodes") >= 3
        assert sample(server, "limen_sessions_restored_total") == 0  # nothing was lost, so nothing replayed


async def test_a_worker_over_its_memory_limit_is_retired_between_sessions(launch):
    async with launch(worker_rss_limit_mb=120) as server:
        leaky = await server.reset("goto-000", env="faulty")
        pid = await faulty_pid(server)
        await server.step(leaky.session_id, 1, "leak 150")
        group = server.running.backend.groups["faulty"]

        async def retired() -> None:
            while not any(w.retiring for w in group.workers):
                await asyncio.sleep(0.05)
        await asyncio.wait_for(retired(), 5)
        newcomer = await server.reset("goto-003", env="faulty")
        assert group.workers[-1].pid != pid and newcomer.session_id in group.workers[-1].sessions
        assert (await server.step(leaky.session_id, 2, "look")).step_index == 2  # its session goes on
        await server.stub.Close(env_pb2.CloseRequest(session_id=leaky.session_id))

        async def gone() -> None:
            while pid in [w.pid for w in group.workers]:
                await asyncio.sleep(0.05)
        await asyncio.wait_for(gone(), 5)
        assert sample(server, "limen_worker_restarts_total", env="faulty", reason="rss") == 1
        assert sample(server, "limen_sessions_restored_total") == 0


async def test_a_reset_over_its_budget_is_cut_and_frees_its_slot(launch):
    async with launch(reset_timeout_s=0.3) as server:
        neighbour = await play_on(server, await server.reset("fetch-007", env="faulty", seed=5), 1)
        error = await server.error(server.reset("goto-000", env="faulty", options={"reset_delay_s": "5"}))
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "did not answer reset" in error.details()
        assert (await finish(server, neighbour))[-1].won
        assert (await server.load()).active_sessions == 0
