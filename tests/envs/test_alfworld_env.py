"""AlfWorldEnv's contract: splits and task ids, transitions, turn limit, expert advice, determinism, errors."""

from __future__ import annotations

import json
import random
import shutil
import sys

import pytest

from alfworld_fixtures import GENERATED, generated_cache_dir, generated_env, official_data_dir, one_task_per_category
from env_server.envs.alfworld import engine, games, speed
from env_server.envs.alfworld.env import AlfWorldEnv, instruction_of
from env_server.envs.base import EpisodeOver, TaskExcluded, UnknownSplit, UnknownTask
from env_server.registry import make

CATEGORIES = ["clean", "cool", "heat", "look", "pick", "pick2"]


def expert_play(env: AlfWorldEnv, split: str, task_id: str, seed: int = 0, max_turns: int = 0) -> list:
    results = [env.reset(split, task_id, seed=seed, max_turns=max_turns)]
    while not results[-1].done and "expert_action" in results[-1].info:
        results.append(env.step(results[-1].info["expert_action"]))
    return results


def test_with_no_data_the_env_serves_generated_splits_of_all_six_categories(monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    env = make("alfworld", cache_dir=generated_cache_dir(), **GENERATED)
    splits = env.splits()
    assert sorted(splits) == ["gen_test", "gen_train"]
    assert splits["gen_train"].categories == tuple(CATEGORIES)
    assert len(splits["gen_train"].playable) == GENERATED["gen_train_games"]
    for task in splits["gen_train"].tasks:
        task_type, _, trial = task.task_id.partition("/")
        assert games.CATEGORY_OF_TASK_TYPE[games.task_type_of(task_type)] == task.category
        assert trial.startswith("trial_gen_s0_")
    assert "generated" in splits["gen_test"].description


@pytest.mark.data
def test_official_splits_have_the_official_counts_and_categories():
    env = AlfWorldEnv(data_dir=official_data_dir())
    splits = env.splits()
    counts = {name: len(splits[name].playable) for name in ("valid_seen", "valid_unseen", "valid_train")}
    assert counts == {"valid_seen": 140, "valid_unseen": 134, "valid_train": 200}
    assert all(splits[name].categories == tuple(CATEGORIES) for name in counts)
    assert "gen_train" not in splits  # generated splits join official data only when asked
    both = AlfWorldEnv(data_dir=official_data_dir(), generated=True, cache_dir=generated_cache_dir(), **GENERATED)
    assert set(both.splits()) == set(splits) | {"gen_train", "gen_test"}
    task_id = "look_at_obj_in_light-AlarmClock-None-DeskLamp-323/trial_T20190909_044715_250790"
    assert env.game_file("valid_seen", task_id).parts[-4:-1] == ("valid_seen", *task_id.split("/"))


def test_every_transition_carries_observation_instruction_and_admissible_actions_without_help():
    env = generated_env()
    for task_id in one_task_per_category(env, "gen_train"):
        for result in expert_play(env, "gen_train", task_id):
            assert result.observation and result.instruction and result.task_id == task_id
            assert "help" not in result.admissible_actions
            assert result.admissible_actions == sorted(result.admissible_actions)
        assert result.won and result.terminated and result.reward == result.score == 1.0
        assert not result.truncated and "expert_action" not in result.info
    env.close()


def test_the_first_observation_states_the_task_and_the_instruction_is_that_sentence():
    env = generated_env()
    first = env.reset("gen_train", env.splits()["gen_train"].playable[0].task_id)
    assert first.observation.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert first.observation.endswith(f"Your task is to: {first.instruction}.")
    assert instruction_of("-= x =-\n\nYour task is to: put a mug in sinkbasin.") == "put a mug in sinkbasin"
    with pytest.raises(ValueError, match="states no task"):
        instruction_of("You are in the middle of a room.")
    env.close()


def test_the_turn_limit_truncates_and_a_step_after_the_end_is_refused():
    env = generated_env()
    task_id = env.splits()["gen_train"].playable[0].task_id
    results = [env.reset("gen_train", task_id, max_turns=3)] + [env.step("look") for _ in range(3)]
    assert [r.truncated for r in results] == [False, False, False, True]
    assert not any(r.terminated or r.won for r in results) and results[-1].reward == 0.0
    with pytest.raises(EpisodeOver):
        env.step("look")
    assert not env.reset("gen_train", task_id).done and not env.step("look").done  # it plays on after a reset
    env.close()


def test_an_action_the_game_does_not_know_is_answered_not_raised():
    env = generated_env()
    env.reset("gen_train", env.splits()["gen_train"].playable[0].task_id)
    for action in ("fly to the moon", "", "put mug 1 in sinkbasin 1"):
        result = env.step(action)
        assert result.observation == "Nothing happens." and not result.done
    env.close()


def test_the_expert_advises_in_every_state_and_wins_each_category():
    env = generated_env()
    for task_id in one_task_per_category(env, "gen_train"):
        results = expert_play(env, "gen_train", task_id)
        assert results[0].info["expert_action"] == "look"  # upstream's expert always opens with a look
        assert all("expert_action" in r.info for r in results[:-1])
        assert results[-1].won
    env.close()


def test_sessions_interleaved_in_one_process_play_as_they_would_alone():
    """The expert draws from Python's global random; each session must keep its own stream."""
    alone = {}
    env = generated_env()
    task_ids = [t.task_id for t in env.splits()["gen_train"].playable if t.category == "pick2"][:2]
    for task_id in task_ids:
        alone[task_id] = [(r.observation, r.info.get("expert_action")) for r in expert_play(env, "gen_train", task_id, 7)]
    env.close()

    envs = {task_id: generated_env() for task_id in task_ids}
    played = {task_id: [envs[task_id].reset("gen_train", task_id, seed=7)] for task_id in task_ids}
    while not all(played[t][-1].done for t in task_ids):
        for task_id in task_ids:
            last = played[task_id][-1]
            if not last.done:
                played[task_id].append(envs[task_id].step(last.info["expert_action"]))
            random.random()  # someone else drawing from the global stream in between
    for task_id in task_ids:
        assert [(r.observation, r.info.get("expert_action")) for r in played[task_id]] == alone[task_id]
        envs[task_id].close()


def test_unknown_split_and_task_are_refused_and_ids_are_looked_up_not_joined():
    env = generated_env()
    with pytest.raises(UnknownSplit):
        env.reset("train", "x")
    for task_id in ("nope", "../gen_test/" + env.splits()["gen_test"].playable[0].task_id, "/etc/passwd"):
        with pytest.raises(UnknownTask):
            env.reset("gen_train", task_id)
    with pytest.raises(ValueError, match="no reset options"):
        env.reset("gen_train", env.splits()["gen_train"].playable[0].task_id, options={"x": "1"})


def test_games_upstream_would_skip_are_listed_with_their_reason_and_refused(tmp_path):
    source = generated_env()
    split_dir = tmp_path / games.SPLIT_ROOT / "mixed"
    playable = source.splits()["gen_train"].playable
    for task in playable[:4]:
        shutil.copytree(source.game_file("gen_train", task.task_id).parent, split_dir / task.task_id)
    unsolvable, missing_key, no_game = (split_dir / task.task_id for task in playable[1:4])
    game = json.loads((unsolvable / games.GAME_FILE).read_text())
    (unsolvable / games.GAME_FILE).write_text(json.dumps({**game, "solvable": False}))
    (missing_key / games.GAME_FILE).write_text(json.dumps({k: v for k, v in game.items() if k != "solvable"}))
    (no_game / games.GAME_FILE).unlink()
    shutil.copytree(no_game, split_dir / "pick_and_place_with_movable_recep-Mug-Pan-Sink-1/trial_x")

    env = AlfWorldEnv(data_dir=str(tmp_path))
    tasks = {t.task_id: t for t in env.splits()["mixed"].tasks}
    assert len(tasks) == 5 and [t.task_id for t in env.splits()["mixed"].playable] == [playable[0].task_id]
    reasons = {path.name: tasks[path.relative_to(split_dir).as_posix()].excluded_reason
               for path in (unsolvable, missing_key, no_game)}
    assert reasons == {unsolvable.name: "game.tw-pddl is marked unsolvable",
                       missing_key.name: "game.tw-pddl has no 'solvable' key", no_game.name: "no game.tw-pddl"}
    assert "not played" in tasks["pick_and_place_with_movable_recep-Mug-Pan-Sink-1/trial_x"].excluded_reason
    with pytest.raises(TaskExcluded, match="unsolvable"):
        env.reset("mixed", unsolvable.relative_to(split_dir).as_posix())


def test_engines_are_pooled_so_new_sessions_load_no_new_engine():
    for _ in range(3):
        env = generated_env()
        env.reset("gen_test", env.splits()["gen_test"].playable[0].task_id)
        env.close()
        env.close()  # a second close is harmless
    created = engine.ENGINES.created
    for task in generated_env().splits()["gen_test"].playable:
        env = generated_env()
        env.reset("gen_test", task.task_id)
        env.close()
    assert engine.ENGINES.created == created


def test_version_names_the_code_and_the_games_served():
    env = generated_env()
    assert env.version == f"alfworld-0.4.2+limen-1+{env.data_hash()[:12]}" and len(env.data_hash()) == 64
    assert generated_env().data_hash() == env.data_hash()


def test_bad_config_is_refused_clearly(monkeypatch):
    with pytest.raises(ValueError, match="size must be one of"):
        AlfWorldEnv(size="huge")
    with pytest.raises(ValueError, match="no games to serve"):
        AlfWorldEnv(data_dir="", generated=False)
    with pytest.raises(TypeError):
        AlfWorldEnv(unknown_option=1)


def test_speed_patches_keep_sys_argv_and_refuse_another_textworld(monkeypatch):
    argv = list(sys.argv)
    env = generated_env()
    env.reset("gen_test", env.splits()["gen_test"].playable[-1].task_id)
    assert sys.argv == argv  # fast_downward's translator overwrites it; the patch puts it back
    env.close()
    monkeypatch.setattr(speed, "_installed", False)
    monkeypatch.setattr(speed.textworld, "__version__", "1.6.0")
    with pytest.raises(RuntimeError, match="textworld 1.7.0"):
        speed.install()
