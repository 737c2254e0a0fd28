"""The game generator: official layout, rooms true to their scene, determinism, expert verification, caching."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from alfworld_fixtures import SLOW_TIMEOUT_S, GENERATED, generated_cache_dir, generated_env
from env_server.envs.alfworld import games, generate, rooms
from env_server.envs.alfworld.rooms import SIZES, TASK_TYPES, load_scene, pddl_problem, sample_game

DECLARATION = re.compile(r"^\s*(\S+) - (\w+)$", re.M)


def sampled_games(size: str, per_type: int = 8):
    for task_type in TASK_TYPES:
        for k in range(per_type):
            yield sample_game(task_type, random.Random(f"{size}:{task_type}:{k}"), SIZES[size], f"trial_{k}")


@pytest.mark.parametrize("size", sorted(SIZES))
def test_rooms_respect_the_size_knob_the_scene_and_the_task(size):
    limits = SIZES[size]
    for game in sampled_games(size):
        scene = load_scene(game.floorplan)
        assert {r.cls for r in game.receptacles} <= rooms.scene_receptacle_classes(scene)
        assert {o.cls for o, _ in game.objects} <= scene.classes
        assert limits.receptacles[0] <= len(game.receptacles) <= limits.receptacles[1]
        targets = [o for o, _ in game.objects if o.cls == game.target]
        assert len(game.objects) - len(targets) - bool(game.toggle) <= limits.distractors[1]
        assert len(targets) >= (2 if game.task_type == "pick_two_obj_and_place" else 1)
        if game.parent:
            assert game.target in rooms.FITS_IN[game.parent]
            assert game.parent in {r.cls for r in game.receptacles}
            # no target starts where it must end up
            where = {r.pddl_id: r.cls for r in game.receptacles}
            assert all(where[r] != game.parent for o, r in game.objects if o.cls == game.target)
        if game.task_type in rooms.APPLIANCE:
            assert rooms.APPLIANCE[game.task_type] in {r.cls for r in game.receptacles}
        if game.task_type == "look_at_obj_in_light":
            assert rooms.LAMP in {o.cls for o, _ in game.objects}
        assert game.target.lower() in game.sentence and (game.parent or game.toggle).lower() in game.sentence


def test_the_pddl_problem_is_well_formed_and_ends_in_the_tasks_goal():
    for game in sampled_games("medium", per_type=3):
        problem = pddl_problem(game)
        assert problem.count("(") == problem.count(")")
        names = [name for name, _ in DECLARATION.findall(problem)]
        assert len(names) == len(set(names)), "every object is declared once"
        locations = [r.location for r in game.receptacles]
        assert len(locations) == len(set(locations)) and game.start not in locations
        assert f"(objectType ?o {game.target}Type)" in problem or f"(objectType ?o1 {game.target}Type)" in problem
        # ids spell ALFRED names, which the demangler turns into "sinkbasin 1", never "sinkbasinbasin"
        assert "SinkBasin_bar_" not in problem and "BathtubBasin_bar_" not in problem


def test_generated_splits_are_in_the_official_layout_and_every_walkthrough_wins():
    env = generated_env()
    split_dir = env.game_file("gen_train", env.splits()["gen_train"].playable[0].task_id).parents[2]
    manifest = json.loads((split_dir / games.MANIFEST_FILE).read_text())
    assert sum(manifest["kept"].values()) == GENERATED["gen_train_games"] and set(manifest["kept"]) == set(TASK_TYPES)
    for task in env.splits()["gen_train"].playable:
        game = json.loads(env.game_file("gen_train", task.task_id).read_text())
        traj = json.loads((env.game_file("gen_train", task.task_id).parent / games.TRAJ_FILE).read_text())
        assert set(game) == {"pddl_domain", "grammar", "pddl_problem", "solvable", "walkthrough"} and game["solvable"]
        assert traj["task_type"] == games.task_type_of(task.task_id)
        assert set(traj["pddl_params"]) == {"object_target", "parent_target", "toggle_target", "mrecep_target", "object_sliced"}
        result = env.reset("gen_train", task.task_id, max_turns=len(game["walkthrough"]))
        for action in game["walkthrough"]:
            assert action in result.admissible_actions + ["help"]  # a stuck expert draws from every command
            result = env.step(action)
        assert result.won
    env.close()


def test_a_seed_always_gives_the_same_games_through_the_cli(tmp_path, capsys):
    spec = generated_env().config.generated_splits()["gen_test"]
    assert generate.main(["--out", str(tmp_path), "--n", str(spec.n), "--seed", str(spec.seed), "--size", spec.size]) == 0
    assert "kept    6 of    6 attempts (100.0%)" in capsys.readouterr().out
    cached = generated_env().game_file("gen_test", generated_env().splits()["gen_test"].playable[0].task_id).parents[2]
    assert file_tree(tmp_path) == file_tree(cached)
    other_seed = {t.task_id for t in generated_env().splits()["gen_train"].playable}
    assert not other_seed & set(file_tree(tmp_path))


def file_tree(root: Path) -> dict[str, bytes]:
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def test_generated_splits_are_made_once_and_found_again_by_their_parameters():
    root = generate.generated_root(Path(generated_cache_dir()), generated_env().config.generated_splits())
    manifests = {p: p.stat().st_mtime_ns for p in root.rglob(games.MANIFEST_FILE)}
    splits = tuple(sorted(generated_env().config.generated_splits().items()))
    again = generate._generated_root.__wrapped__(Path(generated_cache_dir()), splits)  # past the in-process cache
    assert again == root and {p: p.stat().st_mtime_ns for p in root.rglob(games.MANIFEST_FILE)} == manifests
    assert sorted(p.name for p in (root / games.SPLIT_ROOT).iterdir()) == ["gen_test", "gen_train"]


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="low <= high"):
        rooms.GameSize(receptacles=(5, 3), distractors=(0, 1), targets=(1, 1))
    with pytest.raises(ValueError, match="targets must start"):
        rooms.GameSize(receptacles=(3, 5), distractors=(0, 1), targets=(0, 1))
    with pytest.raises(ValueError, match="n must be"):
        generate.generate_split(Path("/nonexistent"), 0, 0)


@pytest.mark.slow
@pytest.mark.timeout(SLOW_TIMEOUT_S)
@pytest.mark.parametrize("size, n", [("small", 120), ("medium", 60), ("full", 30)])
def test_at_least_95_percent_of_attempts_pass_the_expert_and_every_task_type_appears(tmp_path, size, n):
    report = generate.generate_split(tmp_path, n, seed=11, size=size)
    assert report.pass_rate() >= 0.95, dict(report.attempts)
    assert all(report.kept[task_type] > 0 for task_type in TASK_TYPES)
    assert Counter(games.task_type_of(p.relative_to(tmp_path).as_posix()) for p in tmp_path.glob("*/*")) == report.kept


def test_the_games_depend_only_on_the_split_parameters(tmp_path):
    """Not on the generating process's hash seed, nor on how many processes play the attempts. With seed 7 the
    expert wins attempt 23 (a pick_two game) only under some hash seeds: 24 games asked for, a split verified
    in the caller's process would end at attempt 23 or 24 depending on PYTHONHASHSEED."""
    for hash_seed, workers in (("1", 1), ("2", 2)):
        command = [sys.executable, "-m", "env_server.envs.alfworld.generate", "--out", str(tmp_path / hash_seed),
                   "--n", "24", "--seed", "7", "--workers", str(workers)]
        subprocess.run(command, env=os.environ | {"PYTHONHASHSEED": hash_seed}, check=True, capture_output=True)
    assert file_tree(tmp_path / "1") == file_tree(tmp_path / "2")
    assert len(list((tmp_path / "2").glob("*/*"))) == 24   # nothing played ahead was left behind


def test_a_failed_generation_in_the_child_says_why(tmp_path):
    with pytest.raises(RuntimeError, match="(?s)failed in .*invalid choice: 'no-such-size'"):
        generate._generate_in_child(tmp_path, 2, seed=7, size="no-such-size", workers=1)


def test_gen_val_is_asked_for_and_shares_no_room_with_the_other_splits():
    without, with_val = generated_env(), generated_env(gen_val_games=6)
    assert "gen_val" not in without.splits() and len(with_val.splits()["gen_val"].playable) == 6
    for split in ("gen_train", "gen_test"):   # adding gen_val changes no game of the others
        assert [t.task_id for t in with_val.splits()[split].playable] == [t.task_id for t in without.splits()[split].playable]
    root = generate.generated_root(Path(generated_cache_dir()), with_val.config.generated_splits())
    rooms = {split: generate.split_fingerprints(root, split) for split in ("gen_train", "gen_test", "gen_val")}
    assert [len(rooms[s]) for s in rooms] == [GENERATED["gen_train_games"], GENERATED["gen_test_games"], 6]
    assert not rooms["gen_val"].keys() & (rooms["gen_train"].keys() | rooms["gen_test"].keys())


def test_a_room_drawn_twice_has_one_fingerprint_whatever_its_trial_name(tmp_path):
    root = generate.generated_root(Path(generated_cache_dir()), generated_env().config.generated_splits())
    game = sorted((root / "json_2.1.1" / "gen_test").glob("*/*/game.tw-pddl"))[0]
    renamed = tmp_path / "game.tw-pddl"
    renamed.write_text(game.read_text().replace(game.parent.name, "trial_gen_s9_000001"))
    assert renamed.read_text() != game.read_text()
    assert generate.room_fingerprint(renamed) == generate.room_fingerprint(game)
