"""Which RL checkpoints `make real-model`'s learning curve reads: RL saves every 2 iterations so that a kill costs
little, but evaluating each would cost hours; the curve reads the SFT start, every curve_every-th and the last."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from real_model_results import curve_points  # noqa: E402


def saved(*iterations: int) -> list[tuple[int, Path]]:
    return [(0, Path("sft"))] + [(i, Path(f"iter_{i}")) for i in iterations]


def test_the_curve_reads_the_start_every_eighth_iteration_and_the_last():
    every_second = saved(*range(1, 24, 2))   # iterations 1, 3, ..., 23: save_every=2 over 24 iterations
    assert [i for i, _ in curve_points(every_second, 8)] == [0, 7, 15, 23]


def test_an_unfinished_run_still_ends_its_curve_at_the_last_checkpoint():
    assert [i for i, _ in curve_points(saved(1, 3, 5, 7, 9), 8)] == [0, 7, 9]
    assert [i for i, _ in curve_points(saved(), 8)] == [0]
