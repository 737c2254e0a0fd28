"""Which RL checkpoints `make real-model`'s learning curve reads: RL saves every 2 iterations so that a kill costs
little, but evaluating each would cost hours; the curve reads the SFT start, every curve_every-th and the last."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from real_model_results import curve_points, rows_already_played  # noqa: E402

from trainer_client.checkpoints import checkpoint_dir, iterations_done  # noqa: E402


def saved(*iterations: int) -> list[tuple[int, Path]]:
    return [(0, Path("sft"))] + [(i, Path(f"iter_{i}")) for i in iterations]


def test_the_curve_reads_the_start_every_eighth_iteration_and_the_last():
    every_second = saved(*range(1, 24, 2))   # iterations 1, 3, ..., 23: save_every=2 over 24 iterations
    assert [i for i, _ in curve_points(every_second, 8)] == [0, 7, 15, 23]


def test_an_unfinished_run_still_ends_its_curve_at_the_last_checkpoint():
    assert [i for i, _ in curve_points(saved(1, 3, 5, 7, 9), 8)] == [0, 7, 9]
    assert [i for i, _ in curve_points(saved(), 8)] == [0]


def test_the_curve_takes_its_start_and_end_from_the_full_evaluations_when_they_played_its_games():
    rows = [{"split": split, "task_id": game, "seed": seed, "won": seed == 0}
            for split in ("valid_seen", "valid_unseen") for game in ("a", "b", "c") for seed in (0, 1)]
    chosen = rows_already_played(rows, "valid_seen", 0, ["a", "c"])
    assert [(r["split"], r["task_id"], r["seed"]) for r in chosen] == [("valid_seen", "a", 0), ("valid_seen", "c", 0)]
    assert rows_already_played(rows, "valid_seen", 0, ["a", "d"]) is None   # a game it did not play: play them all
    assert rows_already_played([], "valid_seen", 0, ["a"]) is None


def test_a_point_is_labelled_by_the_iterations_its_checkpoint_had_done():
    assert iterations_done(checkpoint_dir(Path("runs/rl"), 23) / "policy") == 24
    assert iterations_done(checkpoint_dir(Path("runs/rl"), 0)) == 1
