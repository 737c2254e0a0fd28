"""Paired gain with a bootstrap over games, against hand-computed cases; per-episode outcomes of an evaluation
(EvalResult and its results-file form) as its input."""

from __future__ import annotations

import json
import math
import random

import pytest

from trainer_client.evaluate import summarize
from trainer_client.paired import compare, game_means, outcome_values, paired_gain, paired_report, seed_game_gain
from trainer_client.rollout import EpisodeRecord, TaskRef, Turn


def test_a_constant_difference_has_a_zero_width_interval():
    # The games differ a lot (0 vs 1) but every game gains exactly 1: pairing removes the spread.
    before = {"a": 0.0, "b": 0.0, "c": 1.0}
    after = {"a": 1.0, "b": 1.0, "c": 2.0}
    assert paired_gain(before, after, n_boot=500) == (1.0, 1.0, 1.0)


def test_two_games_by_hand():
    # Differences (1, 0): a resample's mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4, so the 2.5%
    # and 97.5% points are 0 and 1.
    gain, lo, hi = paired_gain({"a": 0.0, "b": 1.0}, {"a": 1.0, "b": 1.0}, n_boot=20_000, seed=1)
    assert (gain, lo, hi) == (0.5, 0.0, 1.0)


def test_one_game_and_ties():
    assert paired_gain({"a": 0.25}, {"a": 0.75}) == (0.5, 0.5, 0.5)
    assert paired_gain({"a": 1.0, "b": 0.0}, {"a": 1.0, "b": 0.0}) == (0.0, 0.0, 0.0)


def test_the_interval_matches_the_normal_approximation():
    # 100 games: 30 gained a win, 70 unchanged. Gain 0.3; the mean's std is sqrt(0.3 * 0.7 / 100) = 0.0458, so
    # a 95% interval of about 0.3 -+ 1.96 x 0.0458 = [0.210, 0.390] (the bootstrap's is discrete: steps of 0.01).
    before = {f"g{i}": 0.0 for i in range(100)}
    after = {f"g{i}": 1.0 if i < 30 else 0.0 for i in range(100)}
    gain, lo, hi = paired_gain(before, after, n_boot=20_000, seed=0)
    assert gain == pytest.approx(0.3)
    assert lo == pytest.approx(0.21, abs=0.012) and hi == pytest.approx(0.39, abs=0.012)
    assert paired_gain(after, before, n_boot=20_000, seed=0) == pytest.approx((-0.3, -hi, -lo), abs=0.011)


def test_it_is_a_pure_function_of_its_arguments():
    before = {f"g{i}": float(i % 3 == 0) for i in range(50)}
    after = {f"g{i}": float(i % 2 == 0) for i in range(50)}
    assert paired_gain(before, after, seed=4) == paired_gain(dict(reversed(before.items())), after, seed=4)
    assert paired_gain(before, after, seed=4) != paired_gain(before, after, seed=5)


def test_unpaired_inputs_are_refused():
    with pytest.raises(ValueError, match="same games: 1 only before, 0 only after"):
        paired_gain({"a": 0.0, "b": 1.0}, {"a": 1.0})
    with pytest.raises(ValueError, match="no games"):
        paired_gain({}, {})


def test_a_game_is_its_mean_over_seeds():
    values = {("a", 0): 1.0, ("a", 1): 0.0, ("a", 2): 0.0, ("b", 0): 1.0}
    assert game_means(values) == {"a": pytest.approx(1 / 3), "b": 1.0}


def record(task_id: str, seed: int, won: bool, score: float, dropped: str = "") -> EpisodeRecord:
    turn = Turn((1,), (2,), (-0.1,), "obs", "go", True, 0.0, float(won), False)
    return EpisodeRecord(TaskRef("toy", "test", task_id, seed=seed), category="goto", turns=[turn], won=won,
                         score=score, dropped=dropped)


def test_outcomes_of_an_evaluation_and_of_its_results_file():
    seed0 = summarize("toy", "test", [record("a", 0, True, 1.0), record("b", 0, False, 0.2),
                                      record("c", 0, False, 0.0, dropped="UNAVAILABLE")])
    seed1 = summarize("toy", "test", [record("a", 1, False, 0.0), record("b", 1, True, 1.0),
                                      record("c", 1, True, 1.0)])
    assert seed0.outcomes[("a", 0)].won and ("c", 0) not in seed0.outcomes    # dropped: never scored
    from_results = outcome_values([seed0, seed1])
    as_file = [json.loads(json.dumps(r.as_dict())) for r in (seed0, seed1)]
    assert outcome_values(as_file) == from_results == {("a", 0): 1.0, ("b", 0): 0.0, ("a", 1): 0.0,
                                                       ("b", 1): 1.0, ("c", 1): 1.0}
    assert outcome_values(as_file, "score")[("b", 0)] == 0.2
    with pytest.raises(ValueError, match="no per-episode outcomes"):
        outcome_values([{"success": 0.5}])
    with pytest.raises(ValueError, match="twice"):
        outcome_values([seed0, seed0])


def test_compare_pairs_episodes_both_sides_finished():
    before = {("a", 0): 0.0, ("a", 1): 1.0, ("b", 0): 0.0, ("b", 1): 0.0, ("c", 0): 1.0}
    after = {("a", 0): 1.0, ("a", 1): 1.0, ("b", 0): 1.0, ("b", 1): 1.0}    # ("c", 0) dropped after
    result = compare(before, after, n_boot=2000)
    # Game a: 0.5 -> 1.0, game b: 0 -> 1; c is left out. Gain (0.5 + 1) / 2.
    assert (result.games, result.episodes, result.left_out) == (2, 4, 1)
    assert (result.before, result.after, result.gain) == (0.25, 1.0, 0.75)
    assert result.lo == 0.5 and result.hi == 1.0
    assert "gain +0.750 [+0.500, +1.000]" in result.describe() and "1 unpaired" in result.describe()
    assert not math.isnan(result.gain)


def results_file(label: str, runs: list) -> dict:
    """A results file's shape (limen-eval --out) around EvalResult.as_dict runs, through JSON."""
    return json.loads(json.dumps({"label": label, "env": "toy", "split": "test",
                                  "runs": [{"seed": r.episodes[0].task.seed, **r.as_dict()} for r in runs]}))


def test_paired_report_compares_each_label_with_the_first():
    sft = results_file("sft", [summarize("toy", "test", [record("a", 0, False, 0.0), record("b", 0, True, 1.0)])])
    rl_runs = [results_file("rl", [summarize("toy", "test", [record("a", 0, won, 0.0), record("b", 0, True, 1.0)])])
               for won in (True, False)]   # two training runs of one label: a's outcome is their mean, 0.5
    other_split = {**sft, "split": "valid"}
    old = {"label": "old", "env": "toy", "split": "test", "runs": [{"success": 0.5}]}
    report = paired_report([sft, *rl_runs, other_split, old], n_boot=1000)
    lines = report.splitlines()
    # Game a: 0 -> 0.5, game b: 1 -> 1; gain 0.25, resample means 0, 0.25, 0.5.
    assert lines[0] == ("- toy test, rl vs sft: 0.500 -> 0.750: gain +0.250 [+0.000, +0.500] "
                        "(95% bootstrap over 2 games)")
    assert lines[1] == "(not compared, no per-episode outcomes in their files: old)" and len(lines) == 2
    assert paired_report([sft]) == ""


def test_seeds_that_disagree_widen_the_seed_aware_interval_only():
    # Within each training seed every game gains the same, so games add no noise; seed 0 gains 1, seed 1 gains 0.
    # Pooled over seeds each game gains 0.5 exactly (zero width); resampling the two seeds gives 0, 0.5 or 1.
    games = ("a", "b", "c")
    before = {0: dict.fromkeys(games, 0.0), 1: dict.fromkeys(games, 0.0)}
    after = {0: dict.fromkeys(games, 1.0), 1: dict.fromkeys(games, 0.0)}
    assert seed_game_gain(before, after, n_boot=20_000, seed=1) == (0.5, 0.0, 1.0)
    pooled = {g: (after[0][g] + after[1][g]) / 2 for g in games}
    assert paired_gain(dict.fromkeys(games, 0.0), pooled, n_boot=2_000) == (0.5, 0.5, 0.5)


def test_one_seed_is_the_bootstrap_over_games():
    rng = random.Random(3)
    before = {g: float(rng.random() < 0.4) for g in map(str, range(300))}
    after = {g: float(rng.random() < 0.55) for g in before}
    one_seed = seed_game_gain({7: before}, {7: after}, n_boot=20_000)
    over_games = paired_gain(before, after, n_boot=20_000)
    assert one_seed[0] == over_games[0]
    assert one_seed[1] == pytest.approx(over_games[1], abs=0.008) and one_seed[2] == pytest.approx(over_games[2], abs=0.008)


def test_the_seed_aware_interval_refuses_unmatched_seeds_or_games():
    with pytest.raises(ValueError, match="same training seeds"):
        seed_game_gain({0: {"a": 1.0}}, {1: {"a": 1.0}})
    with pytest.raises(ValueError, match="same games"):
        seed_game_gain({0: {"a": 1.0}, 1: {"b": 1.0}}, {0: {"a": 1.0}, 1: {"b": 1.0}})
