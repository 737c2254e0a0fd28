"""The learning study's smallest configuration (configs/study_smoke.yaml: 1 seed, 2 iterations, every core
algorithm, the toy env through a real env server), run end to end; RESULTS.md checked number by number
against the run's results files; a rerun skips what is done; the generated "what happened" on made-up
3-seed results."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from training_fixtures import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "study_smoke.yaml"
CORE = ("boundary", "grpo", "ppo_critic_turn", "ppo_critic_verl")


@pytest.fixture(scope="module")
def study():
    return load_benchmark(ROOT / "benchmarks" / "learning_study.py")


@pytest.fixture(scope="module")
def smoke_run(study, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("study_smoke")
    assert study.main(["--config", str(SMOKE), f"out_dir={out}", f"report_dir={out}", "--threads", "2"]) == 0
    return out


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def table_rows(markdown: str, heading: str) -> list[list[str]]:
    """The cells of the first table under `## heading` (header and separator dropped)."""
    section = markdown.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def test_smoke_study_runs_every_core_algorithm(smoke_run):
    sft = read(smoke_run / "seed_0" / "sft.json")
    assert sft["evaluations"]["test"]["episodes"] == 12 and sft["expert_won"] == sft["expert_episodes"] == 24
    for arm in CORE:
        result = read(smoke_run / "seed_0" / arm / "results.json")
        assert (result["arm"], result["seed"], result["iterations"], result["episodes_per_iteration"]) == (arm, 0, 2, 8)
        assert result["group_size"] == (8 if arm == "grpo" else 1)
        evaluation = result["evaluations"]["test"]
        assert evaluation["episodes"] + evaluation["dropped"] == evaluation["tasks_played"] == 12
        assert sum(c["episodes"] for c in evaluation["by_category"].values()) == evaluation["episodes"]
        rows = [json.loads(line) for line in (smoke_run / "seed_0" / arm / "metrics.jsonl").read_text().splitlines()]
        assert [row["iteration"] for row in rows] == [0, 1]
        assert result["time_per_iteration"]["iteration"] == pytest.approx(
            statistics.fmean(row["time/iteration"] for row in rows))
        # Each arm started from the seed's one SFT checkpoint.
        config = (smoke_run / "seed_0" / arm / "config.yaml").read_text()
        assert f"path: {smoke_run / 'seed_0' / 'sft'}" in config
    assert (smoke_run / "results_learning_curves.png").stat().st_size > 10_000


def test_results_md_numbers_equal_the_results_files(smoke_run):
    markdown = (smoke_run / "RESULTS.md").read_text()
    runs = {"SFT (start)": read(smoke_run / "seed_0" / "sft.json")}
    runs |= {arm: read(smoke_run / "seed_0" / arm / "results.json") for arm in CORE}

    # The per-category table: one seed, so each cell is that run's success in % (no std).
    held_out = table_rows(markdown, "Held-out success on `test`")
    header = markdown.split("## Held-out success on `test`\n", 1)[1].split("\n")[1]
    columns = [c.strip() for c in header.strip("|").split("|")][1:]
    assert [row[0] for row in held_out] == list(runs)
    for row in held_out:
        evaluation = runs[row[0]]["evaluations"]["test"]
        for title, cell in zip(columns, row[1:]):
            category = title.removeprefix("toy ")
            value = evaluation["success"] if category == "All" else evaluation["by_category"][category]["success"]
            assert cell == f"{100 * value:.1f}", (row[0], title)

    # Every run's own row, and the time table.
    for label, seed, success, per_iteration, _ in table_rows(markdown, "Every run"):
        run = runs[label]
        assert (seed, success) == ("0", f"{100 * run['evaluations']['test']['success']:.1f}")
        assert per_iteration == ("–" if label == "SFT (start)" else f"{run['time_per_iteration']['iteration']:.3f}")
    for row in table_rows(markdown, "Time per iteration and its parts"):
        stages = runs[row[0]]["time_per_iteration"]
        assert row[1:] == [f"{stages[s]:.3f}" for s in ("generation", "env_wait", "old_log_prob", "ref", "values",
                                                          "adv", "update_critic", "update_actor", "iteration")]
    # The generated text quotes the same numbers.
    shared_readout = next(line for line in markdown.splitlines() if line.startswith("- Shared readout"))
    gap = 100 * (runs["boundary"]["evaluations"]["test"]["success"] - runs["ppo_critic_turn"]["evaluations"]["test"]["success"])
    assert f"{gap:+.1f} points" in shared_readout and "one seed only" in shared_readout
    assert "> **Preliminary**: 1 seed(s)" in markdown and "Incomplete" not in markdown


def test_a_rerun_skips_finished_runs(study, smoke_run):
    stamps = {p: p.stat().st_mtime_ns for p in smoke_run.glob("seed_0/**/*.json")}
    assert study.main(["--config", str(SMOKE), f"out_dir={smoke_run}", f"report_dir={smoke_run}"]) == 0
    assert {p: p.stat().st_mtime_ns for p in smoke_run.glob("seed_0/**/*.json")} == stamps


def test_a_held_out_split_missing_from_finished_runs_is_evaluated_on_rerun(study, smoke_run):
    # e.g. valid_seen, when the study first ran without ALFWORLD_DATA: the finished steps keep their training and
    # only play the split they lack, which (lock-step, seeded) gives what a first evaluation would have given.
    files = [smoke_run / "seed_0" / "sft.json", smoke_run / "seed_0" / "grpo" / "results.json"]
    before = [read(path) for path in files]
    for path, result in zip(files, before):
        path.write_text(json.dumps(result | {"evaluations": {}}))
    assert study.main(["--config", str(SMOKE), f"out_dir={smoke_run}", f"report_dir={smoke_run}"]) == 0
    assert [read(path)["evaluations"] for path in files] == [result["evaluations"] for result in before]


def test_a_changed_setting_is_refused_on_an_existing_out_dir(study, smoke_run, capsys):
    with pytest.raises(SystemExit):
        study.main(["--config", str(SMOKE), f"out_dir={smoke_run}", f"report_dir={smoke_run}", "rl.optim.lr=0.5"])
    assert "holds runs made with other settings (rl.optim.lr)" in capsys.readouterr().err


def made_up_results(study, successes: dict[str, list[float]], seconds: dict[str, float]):
    """StudyResults with the given held-out success (0..1) per seed and seconds per iteration per arm."""
    cfg = study.StudyConfig(env="toy", train_split="train", eval_splits=("test",), seeds=(0, 1, 2))

    def evaluation(success: float) -> dict:
        return {"env": "toy", "split": "test", "episodes": 40, "success": success, "score": 100 * success,
                "dropped": 0, "tasks_played": 40, "split_tasks": 40,
                "by_category": {"goto": {"episodes": 40, "won": round(40 * success), "success": success}}}

    def timing(total: float) -> dict:
        return {stage: 0.0 for stage in ("generation", "env_wait", "old_log_prob", "ref", "values", "adv",
                                         "update_critic", "update_actor")} | {"iteration": total}

    sft = {seed: {"evaluations": {"test": evaluation(successes["SFT"][seed])}, "seconds": {"sft": 1.0},
                  "parameters": 750_000, "vocabulary": 2048, "loss_last": 0.5} for seed in range(3)}
    runs = {arm: {seed: {"evaluations": {"test": evaluation(values[seed])}, "time_per_iteration": timing(seconds[arm]),
                         "seconds": {"train": 1.0}} for seed in range(3)}
            for arm, values in successes.items() if arm != "SFT"}
    return study.StudyResults(cfg, sft, runs, {})


def test_what_happened_is_computed_from_the_numbers(study):
    results = made_up_results(study, {
        "SFT": [0.20, 0.22, 0.18],
        "boundary": [0.60, 0.62, 0.58],         # mean 60, std 2
        "grpo": [0.40, 0.50, 0.45],             # mean 45, std 5
        "ppo_critic_turn": [0.54, 0.64, 0.59],  # mean 59, std 5: within noise of boundary
        "ppo_critic_verl": [0.30, 0.32, 0.28],  # mean 30, std 2
    }, {"boundary": 3.0, "grpo": 3.0, "ppo_critic_turn": 4.0, "ppo_critic_verl": 5.0})
    lines = study.what_happened(results, "test")
    text = "\n".join(lines)
    assert lines[0].startswith("Mean held-out success on test, best first (%): boundary 60.0, ppo_critic_turn 59.0")
    assert "Change from the SFT start (20.0), in points: boundary +40.0" in text
    claim = next(line for line in lines if line.startswith("The claim"))
    assert "clearly ahead of ppo_critic_verl, grpo" in claim and "not clearly ahead of ppo_critic_turn" in claim
    shared = next(line for line in lines if line.startswith("Shared readout"))
    assert "boundary 60.0 ± 2.0 vs ppo_critic_turn 59.0 ± 5.0: +1.0 points (within the seed-to-seed std)" in shared
    credit = next(line for line in lines if line.startswith("Turn-level credit"))
    assert "ppo_critic_turn 59.0 ± 5.0 vs ppo_critic_verl 30.0 ± 2.0: +29.0 points (larger than" in credit
    assert "boundary / ppo_critic_turn: 0.750" in text
    markdown = study.render_results(results, "python benchmarks/learning_study.py", interpretation="It learned.")
    assert "| boundary | 60.0 ± 2.0 | 60.0 ± 2.0 |" in markdown
    assert "## Interpretation (the lead's)\n\nIt learned." in markdown and "Preliminary" not in markdown
    assert "> **Incomplete**" not in markdown


def test_unequal_episodes_are_refused_before_any_work(study):
    with pytest.raises(ValueError, match="not a multiple of grpo's group size 8"):
        study.StudyConfig(rl=study.TrainConfig(episodes_per_iteration=12))
    with pytest.raises(ValueError, match="unknown arms"):
        study.StudyConfig(arm_overrides={"ppo": ["optim.lr=1"]})
