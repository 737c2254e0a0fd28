"""The wire contract (proto/limen/env/v1/env.proto), checked against one server over a raw channel.

Any server in any language that passes this is a limen env server. Checks that count sessions assume
nobody else uses the server meanwhile.
"""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from limen.env.v1 import env_pb2

from .kit import (
    CALL_TIMEOUT_S, NOOP_ACTION, RESET_TIMEOUT_S, ConformanceTarget, eventually, expect_status, outcome, scripted_action,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

S = grpc.StatusCode
SERVICE_NAME = env_pb2.DESCRIPTOR.services_by_name["EnvService"].full_name
TRAVERSAL_TASK_ID = "../../etc/passwd"


# ---- discovery: health, reflection, ListEnvs, ListTasks, GetLoad -----------------------------------------


async def test_health_reports_serving_for_liveness_and_readiness(conformance: ConformanceTarget):
    health = health_pb2_grpc.HealthStub(conformance.channel)
    for service in ("", SERVICE_NAME):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=CALL_TIMEOUT_S)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, service


async def test_reflection_lists_the_env_service(conformance: ConformanceTarget):
    reflection = reflection_pb2_grpc.ServerReflectionStub(conformance.channel)
    call = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                           timeout=CALL_TIMEOUT_S)
    services = [s.name async for reply in call for s in reply.list_services_response.service]
    assert SERVICE_NAME in services


async def test_list_envs_describes_the_env(conformance: ConformanceTarget):
    info = conformance.env_info
    assert info.version == f"{info.code_version}+{info.data_hash[:12]}"
    assert info.default_max_turns > 0
    split = next(s for s in info.splits if s.name == conformance.split)
    assert split.num_tasks > 0
    assert sum(split.tasks_per_category.values()) == split.num_tasks
    assert set(split.tasks_per_category) <= set(split.categories)


async def test_list_tasks_whole_and_paged_agree(conformance: ConformanceTarget):
    everything = await conformance.task_ids()
    split = next(s for s in conformance.env_info.splits if s.name == conformance.split)
    assert len(everything) == len(set(everything)) == split.num_tasks

    paged, token, pages = [], "", 0
    while True:
        page = await conformance.stub.ListTasks(
            env_pb2.ListTasksRequest(env=conformance.env, split=conformance.split, page_size=7, page_token=token),
            timeout=CALL_TIMEOUT_S, metadata=conformance.metadata)
        assert len(page.task_ids) <= 7
        playable = [t.task_id for t in page.tasks if not t.excluded_reason]
        assert playable == list(page.task_ids), "tasks must list each playable id, in the same order"
        paged += page.task_ids
        token, pages = page.next_page_token, pages + 1
        if not token:
            break
    assert paged == everything
    assert pages == -(-len(everything) // 7) or pages == -(-len(everything) // 7) + 1


async def test_list_tasks_refuses_bad_paging(conformance: ConformanceTarget):
    request = env_pb2.ListTasksRequest(env=conformance.env, split=conformance.split, page_size=-1)
    await expect_status(conformance.stub.ListTasks(request, timeout=CALL_TIMEOUT_S, metadata=conformance.metadata),
                        S.INVALID_ARGUMENT)
    request = env_pb2.ListTasksRequest(env=conformance.env, split=conformance.split, page_size=5,
                                       page_token="not-a-token")
    await expect_status(conformance.stub.ListTasks(request, timeout=CALL_TIMEOUT_S, metadata=conformance.metadata),
                        S.INVALID_ARGUMENT)


async def test_get_load_reports_capacity_and_identity(conformance: ConformanceTarget):
    load = await conformance.load()
    assert load.capacity > 0 and 0 <= load.active_sessions <= load.capacity
    assert load.server_id and not load.draining
    assert (await conformance.load()).server_id == load.server_id


# ---- unknown names -------------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value", [("env", "no-such-env"), ("split", "no-such-split"),
                                          ("task_id", "no-such-task"), ("task_id", TRAVERSAL_TASK_ID)])
async def test_reset_of_unknown_names_is_refused(conformance: ConformanceTarget, field, value):
    task_id = (await conformance.task_ids())[0]
    request = conformance.reset_request(task_id)
    setattr(request, field, value)
    codes = (S.NOT_FOUND,) if field == "task_id" else (S.NOT_FOUND, S.INVALID_ARGUMENT)
    await expect_status(conformance.stub.Reset(request, timeout=CALL_TIMEOUT_S, metadata=conformance.metadata), *codes)


@pytest.mark.parametrize("field, value", [("env", "no-such-env"), ("split", "no-such-split")])
async def test_list_tasks_of_unknown_names_is_refused(conformance: ConformanceTarget, field, value):
    request = env_pb2.ListTasksRequest(env=conformance.env, split=conformance.split)
    setattr(request, field, value)
    await expect_status(conformance.stub.ListTasks(request, timeout=CALL_TIMEOUT_S, metadata=conformance.metadata),
                        S.NOT_FOUND, S.INVALID_ARGUMENT)


async def test_unknown_session_is_not_found(conformance: ConformanceTarget):
    await expect_status(conformance.step("no-such-session", 1, "look"), S.NOT_FOUND)
    await expect_status(conformance.close("no-such-session"), S.NOT_FOUND)


# ---- reset and step over unary calls ----------------------------------------------------------------------


async def test_reset_opens_a_session_that_echoes_the_request(conformance: ConformanceTarget):
    task_id = (await conformance.task_ids())[0]
    episode_id = f"conformance-echo-{uuid.uuid4().hex}"
    first = await conformance.reset(task_id, seed=7, episode_id=episode_id)
    try:
        assert first.session_id and first.step_index == 0
        assert (first.env, first.split, first.task_id, first.seed, first.episode_id) == (
            conformance.env, conformance.split, task_id, 7, episode_id)
        assert first.version == conformance.env_info.version
        assert first.observation and not (first.terminated or first.truncated)
    finally:
        await conformance.close(first.session_id)


async def test_reset_is_idempotent_by_episode_id(conformance: ConformanceTarget):
    task_id = (await conformance.task_ids())[0]
    before = (await conformance.load()).active_sessions
    episode_id = f"conformance-idempotent-{uuid.uuid4().hex}"
    first = await conformance.reset(task_id, episode_id=episode_id)
    again = await conformance.reset(task_id, episode_id=episode_id)
    try:
        assert again.session_id == first.session_id and outcome(again) == outcome(first)
        assert (await conformance.load()).active_sessions == before + 1
    finally:
        await conformance.close(first.session_id)


async def play_unary(conformance: ConformanceTarget, task_id: str, seed: int, turns: int) -> list[tuple]:
    transition = await conformance.reset(task_id, seed=seed)
    played = [outcome(transition)]
    try:
        for turn in range(turns):
            if transition.terminated or transition.truncated:
                break
            transition = await conformance.step(transition.session_id, turn + 1, scripted_action(transition, turn))
            played.append(outcome(transition))
    finally:
        await conformance.close(transition.session_id)
    return played


async def test_reset_and_a_fixed_action_sequence_are_deterministic(conformance: ConformanceTarget):
    task_ids = await conformance.task_ids()
    for task_id, seed in ((task_ids[0], 0), (task_ids[-1], 12345)):
        assert await play_unary(conformance, task_id, seed, turns=6) == await play_unary(conformance, task_id, seed,
                                                                                          turns=6)


async def test_step_indices_count_from_one_without_gaps(conformance: ConformanceTarget):
    task_id = await conformance.quiet_task_id()
    first = await conformance.reset(task_id)
    try:
        await expect_status(conformance.step(first.session_id, 0, "look"), S.INVALID_ARGUMENT)
        await expect_status(conformance.step(first.session_id, 2, "look"), S.INVALID_ARGUMENT,
                            S.FAILED_PRECONDITION)
        assert (await conformance.step(first.session_id, 1, NOOP_ACTION)).step_index == 1
    finally:
        await conformance.close(first.session_id)


async def test_duplicate_step_index_returns_the_stored_transition(conformance: ConformanceTarget):
    task_id = await conformance.quiet_task_id()
    first = await conformance.reset(task_id, max_turns=2)
    try:
        one = await conformance.step(first.session_id, 1, NOOP_ACTION)
        # A different action under the same index is no retry: refused, and not applied.
        await expect_status(conformance.step(first.session_id, 1, "another action entirely"), S.INVALID_ARGUMENT)
        assert await conformance.step(first.session_id, 1, NOOP_ACTION) == one
        two = await conformance.step(first.session_id, 2, NOOP_ACTION)
        # Had the duplicates stepped the env, the 2-turn limit would have ended the episode before step 2.
        assert two.step_index == 2 and two.truncated and not one.truncated
        assert await conformance.step(first.session_id, 1, NOOP_ACTION) == one
    finally:
        await conformance.close(first.session_id)


async def test_step_after_the_end_is_a_failed_precondition(conformance: ConformanceTarget):
    task_id = await conformance.quiet_task_id()
    first = await conformance.reset(task_id, max_turns=1)
    try:
        last = await conformance.step(first.session_id, 1, NOOP_ACTION)
        assert last.truncated and not last.terminated
        await expect_status(conformance.step(first.session_id, 2, NOOP_ACTION), S.FAILED_PRECONDITION)
        # The finished episode's steps are still answered: a retry of the last step must not fail.
        assert await conformance.step(first.session_id, 1, NOOP_ACTION) == last
    finally:
        await conformance.close(first.session_id)


async def test_close_ends_the_session(conformance: ConformanceTarget):
    task_id = (await conformance.task_ids())[0]
    before = (await conformance.load()).active_sessions
    first = await conformance.reset(task_id)
    assert (await conformance.load()).active_sessions == before + 1
    await conformance.close(first.session_id)
    assert (await conformance.load()).active_sessions == before
    await expect_status(conformance.step(first.session_id, 1, "look"), S.NOT_FOUND)
    await expect_status(conformance.close(first.session_id), S.NOT_FOUND)


@pytest.mark.parametrize("bad_action", [b"\xff\xfe not utf-8", b"x" * 2**20], ids=["not-utf8", "1MB"])
async def test_bad_action_bytes_are_refused_and_the_session_goes_on(conformance: ConformanceTarget, bad_action):
    task_id = await conformance.quiet_task_id()
    first = await conformance.reset(task_id)
    try:
        await expect_status(conformance.step(first.session_id, 1, bad_action), S.INVALID_ARGUMENT)
        assert (await conformance.step(first.session_id, 1, NOOP_ACTION)).step_index == 1
    finally:
        await conformance.close(first.session_id)


async def test_empty_and_unknown_actions_are_answered_not_refused(conformance: ConformanceTarget):
    task_id = await conformance.quiet_task_id()
    first = await conformance.reset(task_id)
    try:
        for step_index, action in enumerate(("", NOOP_ACTION), 1):
            transition = await conformance.step(first.session_id, step_index, action)
            assert transition.step_index == step_index and transition.observation
    finally:
        await conformance.close(first.session_id)


async def test_many_concurrent_sessions(conformance: ConformanceTarget):
    load = await conformance.load()
    count = min(conformance.concurrent_sessions, load.capacity - load.active_sessions)
    task_ids = await conformance.task_ids()

    async def one(i: int) -> tuple[env_pb2.Transition, env_pb2.Transition]:
        first = await conformance.reset(task_ids[i % len(task_ids)], seed=i)
        # Queued behind every other session's reset on the server's workers: a reset's deadline.
        step = await conformance.step(first.session_id, 1, scripted_action(first, 0), timeout_s=RESET_TIMEOUT_S)
        return first, step

    pairs = await asyncio.gather(*(one(i) for i in range(count)))
    try:
        assert len({first.session_id for first, _ in pairs}) == count
        assert (await conformance.load()).active_sessions >= load.active_sessions + sum(
            not step.terminated for _, step in pairs)
        assert all(step.step_index == 1 and step.session_id == first.session_id for first, step in pairs)
    finally:
        await asyncio.gather(*(conformance.close(first.session_id) for first, _ in pairs), return_exceptions=True)
    assert await eventually(lambda: _active_is(conformance, load.active_sessions))


# ---- the Episode stream --------------------------------------------------------------------------------


async def _active_is(conformance: ConformanceTarget, count: int) -> bool:
    return (await conformance.load()).active_sessions == count


async def play_stream(conformance: ConformanceTarget, task_id: str, seed: int, turns: int) -> list[tuple]:
    call = conformance.episode_stream()
    await call.write(env_pb2.EpisodeRequest(reset=conformance.reset_request(task_id, seed=seed)))
    transition = await call.read()
    played = [outcome(transition)]
    for turn in range(turns):
        if transition.terminated or transition.truncated:
            break
        step = env_pb2.StepRequest(step_index=turn + 1, action=scripted_action(transition, turn).encode())
        await call.write(env_pb2.EpisodeRequest(step=step))
        transition = await call.read()
        played.append(outcome(transition))
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert await call.code() is S.OK
    return played


async def test_stream_and_unary_play_the_same_episode(conformance: ConformanceTarget):
    task_id = (await conformance.task_ids())[-1]
    assert await play_stream(conformance, task_id, 3, turns=6) == await play_unary(conformance, task_id, 3, turns=6)


async def test_stream_must_start_with_a_reset(conformance: ConformanceTarget):
    call = conformance.episode_stream()
    await call.write(env_pb2.EpisodeRequest(step=env_pb2.StepRequest(step_index=1, action=b"look")))
    await expect_status(call.read(), S.INVALID_ARGUMENT, S.FAILED_PRECONDITION)


async def test_stream_refuses_bad_action_with_a_status(conformance: ConformanceTarget):
    call = conformance.episode_stream()
    task_id = (await conformance.task_ids())[0]
    await call.write(env_pb2.EpisodeRequest(reset=conformance.reset_request(task_id)))
    await call.read()
    await call.write(env_pb2.EpisodeRequest(step=env_pb2.StepRequest(step_index=1, action=b"\xff")))
    await expect_status(call.read(), S.INVALID_ARGUMENT)


async def test_stream_of_unknown_task_is_not_found(conformance: ConformanceTarget):
    call = conformance.episode_stream()
    await call.write(env_pb2.EpisodeRequest(reset=conformance.reset_request(TRAVERSAL_TASK_ID)))
    await expect_status(call.read(), S.NOT_FOUND)


async def test_stream_session_ends_when_the_client_cancels(conformance: ConformanceTarget):
    before = (await conformance.load()).active_sessions
    task_id = (await conformance.task_ids())[0]
    call = conformance.episode_stream()
    await call.write(env_pb2.EpisodeRequest(reset=conformance.reset_request(task_id)))
    first = await call.read()
    assert (await conformance.load()).active_sessions == before + 1
    call.cancel()
    assert await eventually(lambda: _active_is(conformance, before)), "the cancelled stream's session stayed"
    # The stream's session is gone for unary callers too.
    await expect_status(conformance.step(first.session_id, 1, "look"), S.NOT_FOUND)
