"""The session table on its own: capacity, draining, step_index rules, Reset idempotency, idle expiry,
finished sessions' grace and cap, and the cost of a call whatever the table holds."""

import time

import pytest

from env_server.envs.base import EpisodeOver, StepResult
from env_server.episode import EpisodeSpec, RecordedStep, result_digest
from env_server.errors import ConflictingRetry, Draining, InvalidRequest, ServerFull, StepIndexGap, UnknownSession
from env_server.sessions import SessionTable


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def spec(task_id="t-0", episode_id="", seed=0, env="toy") -> EpisodeSpec:
    return EpisodeSpec(env, "train", task_id, seed=seed, episode_id=episode_id)


def result(observation="obs", done=False) -> StepResult:
    return StepResult(observation, ["look"], "do it", "t-0", "goto", terminated=done, won=done)


def play(table: SessionTable, session, *observations: str, done_at_end=False) -> None:
    """Record a reset and then one step per further observation."""
    for index, observation in enumerate(observations):
        done = done_at_end and index == len(observations) - 1
        action = None if index == 0 else f"action {index}"
        table.record(session, RecordedStep(session.session_id, index, session.spec, result(observation, done), "v"),
                     action)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def table(clock):
    return SessionTable(capacity=2, idle_ttl_s=60, server_id="srv", clock=clock)


def test_capacity_counts_live_episodes_only(table):
    first, _ = table.open(spec())
    second, _ = table.open(spec())
    assert first.session_id.startswith("srv-") and first.session_id != second.session_id
    assert table.full and not table.ready
    with pytest.raises(ServerFull, match="2 session slots"):
        table.open(spec())
    play(table, first, "start", "won", done_at_end=True)  # a finished episode holds no env
    assert not table.full and table.live_count() == 1 and len(table) == 2
    table.open(spec())


def test_draining_refuses_new_sessions_but_not_known_episode_ids(table):
    kept, _ = table.open(spec(episode_id="ep-1"))
    table.draining = True
    assert not table.ready
    with pytest.raises(Draining):
        table.open(spec())
    again, created = table.open(spec(episode_id="ep-1"))
    assert again is kept and not created


def test_repeated_episode_id_returns_the_same_session_while_it_lives(table):
    first, created = table.open(spec(episode_id="ep-1"))
    assert created
    same, created = table.open(spec(episode_id="ep-1"))
    assert same is first and not created
    with pytest.raises(InvalidRequest, match="different"):
        table.open(spec(episode_id="ep-1", seed=7))
    table.end(first, UnknownSession("closed"))
    fresh, created = table.open(spec(episode_id="ep-1", seed=7))
    assert created and fresh is not first


def test_stored_step_returns_applied_steps_and_asks_for_the_next(table):
    session, _ = table.open(spec())
    play(table, session, "start", "one", "two")
    assert table.stored_step(session, 1, "action 1").result.observation == "one"
    assert table.stored_step(session, 2, "action 2").result.observation == "two"
    assert table.stored_step(session, 3, "action 3") is None
    with pytest.raises(StepIndexGap, match="next is 3"):
        table.stored_step(session, 5, "action 5")
    with pytest.raises(InvalidRequest, match="counts from 1"):
        table.stored_step(session, 0, "action 0")
    assert session.actions == ["action 1", "action 2"]
    assert session.digests == [result_digest(t.result) for t in session.transitions]


def test_a_step_after_the_end_is_refused_but_a_retry_of_the_last_is_answered(table):
    session, _ = table.open(spec())
    play(table, session, "start", "won", done_at_end=True)
    assert table.stored_step(session, 1, "action 1").result.won
    with pytest.raises(EpisodeOver, match="ended at step 1"):
        table.stored_step(session, 2, "action 2")


def test_transitions_must_be_recorded_in_order(table):
    session, _ = table.open(spec())
    with pytest.raises(ValueError, match="out of order"):
        table.record(session, RecordedStep(session.session_id, 1, session.spec, result(), "v"), "look")


def test_ended_sessions_answer_with_their_reason(table):
    session, _ = table.open(spec())
    table.end(session, UnknownSession(f"session {session.session_id} was closed"))
    with pytest.raises(UnknownSession, match="was closed"):
        table.get(session.session_id)
    with pytest.raises(UnknownSession, match="no session"):
        table.get("srv-unknown")
    with pytest.raises(UnknownSession, match="was closed"):
        table.check_not_ended(session)


async def test_idle_sessions_expire_unless_a_call_is_in_flight(table, clock):
    idle, _ = table.open(spec())
    busy, _ = table.open(spec())
    clock.now += 30
    assert table.idle() == []
    clock.now += 31
    async with busy.lock:
        assert table.idle() == [idle]
    table.touch(idle)
    assert table.idle() == [busy]


def test_digest_sees_what_the_agent_sees_and_ignores_info():
    base = result("You see a key.")
    assert result_digest(base) == result_digest(base.replace(info={"timing": "3 ms"}))
    assert result_digest(base) != result_digest(base.replace(observation="You see a cup."))
    assert result_digest(base) != result_digest(base.replace(admissible_actions=["take key"]))


def test_episode_spec_rejects_missing_task_and_negative_turn_limit():
    with pytest.raises(InvalidRequest, match="task_id"):
        EpisodeSpec("toy", "train", "")
    with pytest.raises(InvalidRequest, match="max_turns"):
        EpisodeSpec("toy", "train", "t", max_turns=-1)


def test_live_counts_by_env(table):
    table.open(spec(env="toy"))
    table.open(spec(env="faulty"))
    assert table.live_by_env() == {"toy": 1, "faulty": 1}
    assert table.live_count("toy") == 1


def test_a_used_step_index_with_another_action_is_refused_not_answered(table):
    session, _ = table.open(spec())
    play(table, session, "start", "one", "won", done_at_end=True)
    for index in (1, 2):   # a middle step and the last one
        applied = f"step_index {index} .* already applied with action 'action {index}'"
        with pytest.raises(ConflictingRetry, match=applied):
            table.stored_step(session, index, "look")
        assert table.stored_step(session, index, f"action {index}") is session.transitions[index]
    assert isinstance(ConflictingRetry("x"), InvalidRequest)   # INVALID_ARGUMENT, as a step_index gap


def test_a_long_conflicting_action_is_quoted_short(table):
    session, _ = table.open(spec())
    play(table, session, "start", "one")
    with pytest.raises(ConflictingRetry) as caught:
        table.stored_step(session, 1, "x" * 100_000)
    assert len(str(caught.value)) < 400 and "100000 characters" in str(caught.value)


def test_finished_sessions_are_kept_for_their_grace_then_released(clock):
    table = SessionTable(capacity=2, idle_ttl_s=600, server_id="srv", clock=clock, finished_grace_s=30)
    finished, _ = table.open(spec())
    play(table, finished, "start", "won", done_at_end=True)
    live, _ = table.open(spec())
    clock.now += 29
    table.expire_finished()
    assert table.stored_step(finished, 1, "action 1").result.won and table.finished_count() == 1
    clock.now += 2
    table.expire_finished()
    assert finished.session_id not in table and live.session_id in table and table.finished_count() == 0
    with pytest.raises(UnknownSession, match="finished at step 1 and was released .*kept 30 s"):
        table.get(finished.session_id)
    assert table.live_count() == 1


def test_past_the_cap_the_oldest_finished_sessions_go_first(clock):
    table = SessionTable(capacity=1, idle_ttl_s=600, server_id="srv", clock=clock, max_finished=2)
    finished = []
    for _ in range(4):
        session, _ = table.open(spec())   # capacity 1: finished sessions do not count against it
        play(table, session, "start", "won", done_at_end=True)
        finished.append(session)
        clock.now += 1
    assert [s.session_id in table for s in finished] == [False, False, True, True]
    with pytest.raises(UnknownSession, match="more than 2 finished sessions are kept"):
        table.get(finished[0].session_id)


def test_no_finished_session_is_kept_with_a_cap_of_zero(clock):
    table = SessionTable(capacity=1, idle_ttl_s=600, server_id="srv", clock=clock, max_finished=0)
    session, _ = table.open(spec())
    play(table, session, "start", "won", done_at_end=True)
    assert len(table) == 0 and session.ended is not None


def test_closing_a_finished_session_forgets_it_at_once(clock):
    table = SessionTable(capacity=1, idle_ttl_s=600, server_id="srv", clock=clock)
    session, _ = table.open(spec())
    play(table, session, "start", "won", done_at_end=True)
    table.end(session, UnknownSession("closed"))
    assert table.finished_count() == 0 and len(table) == 0 and table.live_count() == 0


def test_idle_expiry_skips_finished_sessions_and_stops_at_the_first_recent_one(table, clock):
    finished, _ = table.open(spec())
    play(table, finished, "start", "won", done_at_end=True)
    old, _ = table.open(spec())
    clock.now += 61
    recent, _ = table.open(spec())
    assert table.idle() == [old]


def test_call_cost_does_not_grow_with_the_sessions_held():
    """Open, step bookkeeping, readiness, load and the sweeps, on a table holding 10,000 finished sessions
    and 200 live ones, cost about what they cost on an empty one (scanning the table costs ~100 times more)."""
    def one_round(table: SessionTable) -> None:
        session, _ = table.open(spec())
        play(table, session, "start", "one")
        table.stored_step(session, 1, "action 1")
        assert table.ready and table.live_by_env() and table.live_count("toy")
        table.expire_finished()
        table.idle()
        table.end(session, UnknownSession("closed"))

    def best_time(table: SessionTable) -> float:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            for _ in range(100):
                one_round(table)
            times.append(time.perf_counter() - started)
        return min(times)

    empty = SessionTable(capacity=1000, idle_ttl_s=600, finished_grace_s=3600, max_finished=100_000)
    crowded = SessionTable(capacity=1000, idle_ttl_s=600, finished_grace_s=3600, max_finished=100_000)
    for i in range(10_000):
        session, _ = crowded.open(spec(task_id=f"t-{i}"))
        play(crowded, session, "start", "won", done_at_end=True)
    for _ in range(200):
        crowded.open(spec())
    assert len(crowded) == 10_200 and crowded.finished_count() == 10_000
    assert best_time(crowded) < 5 * best_time(empty)
