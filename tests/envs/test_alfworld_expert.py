"""Expert-trajectory export (JSONL for SFT) and the expert's win rate on the official eval games in-process."""

from __future__ import annotations

import json

import pytest

from alfworld_fixtures import SLOW_TIMEOUT_S, generated_env, generated_options, official_data_dir
from env_server import expert_export
from env_server.envs.alfworld.env import AlfWorldEnv
from env_server.envs.base import UnknownSplit


def test_export_writes_one_raw_record_per_episode_with_every_turn():
    env = generated_env()
    records = list(expert_export.export(env, "gen_test", n=3, seed=2))
    assert [r["task_id"] for r in records] == [t.task_id for t in env.splits()["gen_test"].playable[:3]]
    for record in records:
        assert record["env"] == "alfworld" and record["split"] == "gen_test" and record["seed"] == 2
        assert record["instruction"] and record["category"] in ("clean", "cool", "heat", "look", "pick", "pick2")
        assert record["won"] and not record["truncated"] and record["length"] == len(record["turns"])
        assert record["turns"][0]["observation"].startswith("-= Welcome to TextWorld, ALFRED! =-")
        for turn in record["turns"]:
            assert turn["expert_action"] in turn["admissible_actions"] + ["look", "help"]
    # the record replays: its actions from the same state give its final observation
    result = env.reset("gen_test", records[0]["task_id"], seed=2)
    for turn in records[0]["turns"]:
        assert result.observation == turn["observation"]
        result = env.step(turn["expert_action"])
    assert result.observation == records[0]["final_observation"] and result.won
    with pytest.raises(UnknownSplit):
        next(expert_export.export(env, "valid_seen"))
    env.close()


def test_the_cli_exports_a_split_of_the_env_it_is_given(tmp_path, capsys):
    out = tmp_path / "expert.jsonl"
    options = [f"{key}={value}" for key, value in generated_options().items()]
    argv = ["--split", "gen_test", "--out", str(out), "--n", "2", "--max-turns", "3"]
    assert expert_export.main(argv + [arg for option in options for arg in ("--env-option", option)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and all(r["length"] <= 3 and (r["won"] or r["truncated"]) for r in records)
    assert "expert won" in capsys.readouterr().out


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.timeout(SLOW_TIMEOUT_S)
def test_the_expert_wins_at_least_254_of_the_274_eval_games_in_process():
    env = AlfWorldEnv(data_dir=official_data_dir())
    won = sum(record["won"] for split in ("valid_seen", "valid_unseen")
              for record in expert_export.export(env, split, max_turns=150))
    assert won >= 254
