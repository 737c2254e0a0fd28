"""Tuning the study's arms on a validation split with one budget, then the final runs on the chosen settings: the
smoke study (toy env, micro model) through --tune and the study, and the pure parts (the choice, the seed-aware
verdict, the comparison at equal wall time) on made-up numbers."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import pytest
import yaml
from study_fixtures import ROOT, SMOKE, made_up_results
from training_fixtures import load_benchmark

from trainer_client import config
from trainer_client.train_config import TrainConfig

import study_config  # noqa: E402  (study_fixtures put benchmarks/ on the path)
import study_curves  # noqa: E402
import study_report  # noqa: E402
import study_stats  # noqa: E402
import study_tuning  # noqa: E402

CORE = ("boundary", "grpo", "ppo_critic_turn", "ppo_critic_verl")
GRID = "{" + ", ".join(f"{arm}: {{optim.lr: [1.0e-3, 2.0e-3]}}" for arm in CORE) + "}"


def tuned_args(out: Path, *extra: str) -> list[str]:
    return ["--config", str(SMOKE), f"out_dir={out}", f"report_dir={out}", f"measurements_dir={out / 'measurements'}",
            "--threads", "2", "rl.save_every=1", "tuning.split=valid", "tuning.episodes=8", f"tuning.grid={GRID}",
            *extra]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> tuple[Path, dict]:
    study = load_benchmark(ROOT / "benchmarks" / "learning_study.py")
    out = tmp_path_factory.mktemp("study_tuned")
    assert study.main(tuned_args(out, "--tune")) == 0
    record = json.loads((out / "tuning.json").read_text())
    chosen = "{" + ", ".join(f"{arm}: [{', '.join(point)}]" for arm, point in record["chosen"].items()) + "}"
    assert study.main(tuned_args(out, f"arm_overrides={chosen}")) == 0
    return out, record


def test_every_core_arm_gets_the_same_runs_judged_on_the_validation_split_only(tuned):
    out, record = tuned
    assert record["complete"] and record["runs_per_arm"] == 2 and record["split"] == "valid" and record["games"] == 8
    for arm in CORE:
        runs = record["runs"][arm]
        assert [run["overrides"] for run in runs] == [["optim.lr=0.001"], ["optim.lr=0.002"]]
        best = max(runs, key=lambda run: run["success"])
        assert record["chosen"][arm] == best["overrides"]
        result = json.loads((out / runs[0]["run"] / "results.json").read_text())
        assert set(result["evaluations"]) == {"valid"} and "curve" not in result   # the test split is not looked at
        assert statistics.fmean(r["success"] for r in result["evaluations"]["valid"]["runs"]) == runs[0]["success"]
    assert (out / "measurements" / "tuning.json").is_file()
    assert len(list((out / "measurements" / "tuning").glob("*/*/results.json"))) == 8


def test_the_final_seed_of_tuning_is_the_chosen_tuning_run_with_its_curve(tuned):
    out, record = tuned
    for arm in CORE:
        result = json.loads((out / "seed_0" / arm / "results.json").read_text())
        chosen = next(run for run in record["runs"][arm] if run["overrides"] == record["chosen"][arm])
        assert result["reused_from"] == str(out / chosen["run"])
        assert result["seconds"]["train"] == chosen["seconds"]["train"]
        assert result["overrides"][-1] == record["chosen"][arm][0]
        curve = result["curve"]
        assert [p["iteration"] for p in curve["points"]] == [0, 1, 2] and curve["games"] == 12
        times = [p["train_seconds"] for p in curve["points"]]
        assert times[0] == 0.0 < times[1] < times[2]
        final = study_curves.episodes_of(result["evaluations"]["test"], 0, [o["task_id"] for o in curve["points"][2]["outcomes"]])
        assert curve["points"][2]["outcomes"] == final
        for p in curve["points"]:
            assert p["success"] == statistics.fmean(o["won"] for o in p["outcomes"]) and len(p["outcomes"]) == 12


def test_the_report_shows_tuning_curves_and_equal_time(tuned):
    out, _ = tuned
    markdown = (out / "RESULTS.md").read_text()
    assert "## Tuning" in markdown and "(chosen)" in markdown and "Rooms are not compared for env toy." in markdown
    assert "![held-out curves](results_held_out_curves.png)" in markdown and (out / "results_held_out_curves.png").is_file()
    summary = json.loads((out / "measurements" / "summary.json").read_text())
    assert set(summary["equal_time"]) == {"grpo", "ppo_critic_turn", "ppo_critic_verl"}
    assert all("seed_ci95" not in c or len(c["per_seed"]) == 1 for c in summary["comparisons"].values())


def test_a_changed_arm_setting_sets_the_old_run_aside_and_runs_it_again(tuned, tmp_path):
    out, record = tuned
    study = load_benchmark(ROOT / "benchmarks" / "learning_study.py")
    chosen = dict(record["chosen"]) | {"grpo": ["optim.lr=0.0005"]}
    overrides = "{" + ", ".join(f"{arm}: [{', '.join(point)}]" for arm, point in chosen.items()) + "}"
    before = {arm: (out / "seed_0" / arm / "results.json").read_text() for arm in CORE}
    assert study.main(tuned_args(out, f"arm_overrides={overrides}")) == 0
    assert (out / "seed_0" / "grpo.replaced_1" / "results.json").read_text() == before["grpo"]
    again = json.loads((out / "seed_0" / "grpo" / "results.json").read_text())
    assert again["overrides"][-1] == "optim.lr=0.0005" and "reused_from" not in again
    for arm in ("boundary", "ppo_critic_turn", "ppo_critic_verl"):   # unchanged: kept as they were
        assert (out / "seed_0" / arm / "results.json").read_text() == before[arm]


# ---- the pure parts ------------------------------------------------------------------------------------------


def test_tuning_grids_give_every_core_arm_one_budget():
    grid = {arm: {"optim.lr": [1, 2, 3], "optim.critic_lr": [4, 5]} for arm in CORE}
    cfg = study_config.StudyConfig(tuning=study_config.TuningConfig(grid=grid))
    assert cfg.tuning.points("boundary")[:3] == [("optim.lr=1", "optim.critic_lr=4"), ("optim.lr=1", "optim.critic_lr=5"),
                                                 ("optim.lr=2", "optim.critic_lr=4")]
    assert len(cfg.tuning.points("grpo")) == 6
    with pytest.raises(ValueError, match="grids of one size"):
        study_config.StudyConfig(tuning=study_config.TuningConfig(grid=grid | {"grpo": {"optim.lr": [1, 2]}}))
    with pytest.raises(ValueError, match="grids of one size"):
        study_config.StudyConfig(tuning=study_config.TuningConfig(grid={"rloo": {"optim.lr": [1]}}))
    with pytest.raises(ValueError, match="none of the training or held-out splits"):
        study_config.StudyConfig(tuning=study_config.TuningConfig(split="gen_test"))


def test_the_choice_is_the_best_validation_success_and_the_first_on_a_tie():
    runs = {"grpo": [{"overrides": ["a"], "success": 0.4}, {"overrides": ["b"], "success": 0.5},
                     {"overrides": ["c"], "success": 0.5}]}
    assert study_tuning.chosen_points(runs) == {"grpo": ["b"]}


def test_a_run_learned_the_same_wherever_it_ran(tmp_path):
    saved = tmp_path / "config.yaml"
    base = TrainConfig()
    tree = config.to_dict(base)
    tree["run_dir"], tree["model"]["path"], tree["env"]["servers"] = "/elsewhere", "/m", ["127.0.0.1:1"]
    tree["rollout"]["batch_wait_s"] = 0.02
    saved.write_text(yaml.safe_dump(tree))
    assert study_config.same_learning(saved, base)
    tree["optim"]["lr"] = 5e-4
    saved.write_text(yaml.safe_dump(tree))
    assert not study_config.same_learning(saved, base)
    saved.write_text(yaml.safe_dump(tree | {"no_longer_a_setting": 1}))
    assert not study_config.same_learning(saved, base)


def test_the_verdict_follows_the_seed_aware_interval():
    results = made_up_results()
    # boundary leads grpo on seed 0 only: seeds 1 and 2 play grpo's games exactly.
    for seed in (1, 2):
        results.runs["boundary"][seed] = copy.deepcopy(results.runs["grpo"][seed])
    gain = study_stats.paired(results.runs["boundary"], results.runs["grpo"], "test")
    assert gain["ci95"][0] > 0                              # over games with the seeds fixed: resolved
    assert gain["seed_ci95"][0] <= 0 < gain["seed_ci95"][1]  # with the seeds resampled: not
    assert gain["per_seed"] == {0: 0.5, 1: 0.0, 2: 0.0}
    assert study_report.verdict("boundary", "grpo", gain).startswith("**no difference resolved**")


def curve(seconds: list[float], success: list[float], games: int = 4) -> dict:
    return {"points": [{"iteration": 8 * k, "train_seconds": t, "success": s,
                        "outcomes": [{"task_id": f"g{g}", "won": g < s * games} for g in range(games)]}
                       for k, (t, s) in enumerate(zip(seconds, success))]}


def test_equal_time_reads_the_checkpoint_each_arm_had_reached_when_boundary_finished():
    runs = {"boundary": {0: {"curve": curve([0, 100, 200], [0.25, 0.5, 0.75])}},
            "ppo_critic_turn": {0: {"curve": curve([0, 150, 300], [0.25, 0.5, 1.0])}},   # slower: at 150 s by then
            "grpo": {0: {"curve": curve([0, 50, 90], [0.0, 0.25, 0.5])}}}               # faster: its end
    picks = study_curves.equal_time(runs)
    assert picks["ppo_critic_turn"][0]["iteration"] == 8 and picks["grpo"][0]["iteration"] == 16
    summary = study_stats.equal_time_summary(runs)
    assert summary["ppo_critic_turn"]["success"] == 0.5 and summary["ppo_critic_turn"]["boundary_success"] == 0.75
    assert summary["ppo_critic_turn"]["boundary_lead"] == 0.25 and summary["grpo"]["boundary_lead"] == 0.25


def test_runs_made_with_an_arms_earlier_settings_are_not_mixed_into_the_summary(tuned, tmp_path):
    out, record = tuned
    cfg = study_config.StudyConfig(env="toy", train_split="train", eval_splits=("test",), seeds=(0,), out_dir=str(out),
                                   arm_overrides={arm: list(point) for arm, point in record["chosen"].items()})
    assert set(study_stats.read_results(cfg).runs) >= {"boundary", "ppo_critic_turn"}
    untuned = study_config.StudyConfig(env="toy", train_split="train", eval_splits=("test",), seeds=(0,), out_dir=str(out))
    assert not study_stats.read_results(untuned).runs   # every arm's run has a tuned setting the untuned study lacks
