"""Byte-identical to upstream: the same actions through limen's env and through unmodified AlfredTWEnv (run in
its own process, free of limen's speed patches) give the same observations, commands, rewards, ends and
expert advice."""

from __future__ import annotations

import pytest

from alfworld_fixtures import SLOW_TIMEOUT_S, generated_env, official_data_dir, replay_against_upstream, upstream_records
from env_server.envs.alfworld.env import AlfWorldEnv

SEED = 5


def check_split_against_upstream(env: AlfWorldEnv, split: str, task_ids: list[str], max_turns: int) -> int:
    files = {env.game_file(split, task_id): task_id for task_id in task_ids}
    records = upstream_records(list(files), policy="mixed", seed=SEED, max_steps=max_turns)
    assert set(records) == set(files)
    steps = sum(replay_against_upstream(env, split, files[path], record, SEED, max_turns)
                for path, record in records.items())
    assert any(record["steps"][-1]["won"] for record in records.values()), "the sample should reach a win"
    env.close()
    return steps


def test_generated_games_play_as_upstream_plays_them():
    env = generated_env()
    task_ids = [t.task_id for t in env.splits()["gen_train"].playable][::2]
    assert check_split_against_upstream(env, "gen_train", task_ids, max_turns=30) > 30


@pytest.mark.data
def test_official_valid_train_games_play_as_upstream_plays_them():
    env = AlfWorldEnv(data_dir=official_data_dir())
    task_ids = [t.task_id for t in env.splits()["valid_train"].playable][::97]
    assert check_split_against_upstream(env, "valid_train", task_ids, max_turns=20) > 20


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.timeout(SLOW_TIMEOUT_S)
def test_twenty_official_valid_train_games_play_as_upstream_plays_them():
    env = AlfWorldEnv(data_dir=official_data_dir())
    task_ids = [t.task_id for t in env.splits()["valid_train"].playable][::10]
    assert check_split_against_upstream(env, "valid_train", task_ids, max_turns=50) > 200
