"""Every bad request of issue 2 gets its documented status code and a useful reason, over a real channel."""

import grpc
import pytest

from limen.env.v1 import env_pb2

CODE = grpc.StatusCode


@pytest.mark.parametrize("fields, code, reason", [
    (dict(env="chess"), CODE.NOT_FOUND, "not served here"),
    (dict(env=""), CODE.INVALID_ARGUMENT, "must be set"),
    (dict(split="dev"), CODE.NOT_FOUND, "no split 'dev'"),
    (dict(split=""), CODE.INVALID_ARGUMENT, "must be set"),
    (dict(task_id="goto-999"), CODE.NOT_FOUND, "no task 'goto-999'"),
    (dict(task_id=""), CODE.INVALID_ARGUMENT, "task_id must be set"),
    (dict(task_id="../../etc/passwd"), CODE.NOT_FOUND, "no task '../../etc/passwd'"),
    (dict(max_turns=-1), CODE.INVALID_ARGUMENT, "max_turns"),
    (dict(env="faulty", task_id="excluded-000"), CODE.FAILED_PRECONDITION, "excluded"),
])
async def test_bad_reset(server, fields, code, reason):
    error = await server.error(server.reset(**fields))
    assert error.code() == code and reason in error.details()
    assert (await server.load()).active_sessions == 0  # a refused reset holds no slot


async def test_unknown_session(server):
    for call in (server.step("nope", 1, "look"), server.stub.Close(env_pb2.CloseRequest(session_id="nope"))):
        error = await server.error(call)
        assert error.code() == CODE.NOT_FOUND and "no session 'nope'" in error.details()


async def test_closed_session_is_not_found_with_its_reason(server):
    first = await server.reset()
    await server.stub.Close(env_pb2.CloseRequest(session_id=first.session_id))
    error = await server.error(server.step(first.session_id, 1, "look"))
    assert error.code() == CODE.NOT_FOUND and "was closed" in error.details()


async def test_step_after_the_episode_ended(server):
    played = await server.play_to_end(await server.reset())
    assert played[-1].won
    error = await server.error(server.step(played[0].session_id, len(played), "look"))
    assert error.code() == CODE.FAILED_PRECONDITION and "episode ended" in error.details()
    # Re-sending the final step is a retry, not a step after the end.
    assert (await server.step(played[0].session_id, len(played) - 1, played[-2].info["expert_action"])) == played[-1]


@pytest.mark.parametrize("action, reason", [
    (b"x" * 1_000_000, "1000000 bytes"),
    (b"x" * (16 * 1024 + 1), "at most 16384"),
    (b"go to \xff\xfe", "not UTF-8"),
])
async def test_bad_actions(server, action, reason):
    first = await server.reset()
    error = await server.error(server.step(first.session_id, 1, action))
    assert error.code() == CODE.INVALID_ARGUMENT and reason in error.details()
    # The session is unharmed: the same step index still works.
    assert (await server.step(first.session_id, 1, "look")).step_index == 1


async def test_empty_action_is_answered_by_the_env(server):
    first = await server.reset()
    answer = await server.step(first.session_id, 1, b"")
    assert answer.observation.startswith("Nothing happens.")


async def test_duplicate_step_index_returns_the_stored_transition_without_stepping(server):
    first = await server.reset(env="faulty")
    coin = await server.step(first.session_id, 1, "coin")  # a random observation on every real step
    assert await server.step(first.session_id, 1, "coin") == coin
    # The same index with another action is no retry but a client bug, and says so.
    error = await server.error(server.step(first.session_id, 1, "something else"))
    assert error.code() == CODE.INVALID_ARGUMENT and "already applied with action 'coin'" in error.details()
    assert (await server.step(first.session_id, 0 + 2, "look")).step_index == 2


@pytest.mark.parametrize("step_index, code, reason", [
    (3, CODE.INVALID_ARGUMENT, "next is 1"),
    (0, CODE.INVALID_ARGUMENT, "counts from 1"),
    (-4, CODE.INVALID_ARGUMENT, "counts from 1"),
])
async def test_step_index_out_of_sequence(server, step_index, code, reason):
    first = await server.reset()
    error = await server.error(server.step(first.session_id, step_index, "look"))
    assert error.code() == code and reason in error.details()


async def test_bad_list_tasks_requests(server):
    cases = [
        (env_pb2.ListTasksRequest(env="chess", split="train"), CODE.NOT_FOUND),
        (env_pb2.ListTasksRequest(env="toy", split="nope"), CODE.NOT_FOUND),
        (env_pb2.ListTasksRequest(env="toy", split="train", page_size=-1), CODE.INVALID_ARGUMENT),
        (env_pb2.ListTasksRequest(env="toy", split="train", page_token="abc"), CODE.INVALID_ARGUMENT),
        (env_pb2.ListTasksRequest(env="toy", split="train", page_token="9999"), CODE.INVALID_ARGUMENT),
    ]
    for request, code in cases:
        assert (await server.error(server.stub.ListTasks(request))).code() == code


async def test_bad_episode_streams(server):
    reset = env_pb2.EpisodeRequest(reset=env_pb2.ResetRequest(env="toy", split="train", task_id="goto-000"))
    step = env_pb2.EpisodeRequest(step=env_pb2.StepRequest(step_index=1, action=b"look"))
    cases = [
        ([step], CODE.FAILED_PRECONDITION, "must be a reset"),
        ([reset, reset], CODE.INVALID_ARGUMENT, "one episode"),
        ([env_pb2.EpisodeRequest()], CODE.INVALID_ARGUMENT, "reset or a step"),
    ]
    for requests, code, reason in cases:
        call = server.stub.Episode(iter(requests))
        error = await server.error(_drain(call))
        assert error.code() == code and reason in error.details()
    assert (await server.load()).active_sessions == 0


async def test_episode_id_makes_reset_idempotent(server):
    first = await server.reset(episode_id="ep-7", seed=3)
    again = await server.reset(episode_id="ep-7", seed=3)
    assert again == first
    error = await server.error(server.reset(episode_id="ep-7", seed=4))
    assert error.code() == CODE.INVALID_ARGUMENT and "already in use" in error.details()
    assert (await server.load()).active_sessions == 1


async def _drain(call) -> list:
    return [message async for message in call]
